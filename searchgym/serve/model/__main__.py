"""`python -m searchgym.agents.server --model-path DIR [--host H --port N ...]`."""

from searchgym.agents.server.app import main

if __name__ == "__main__":
    main()

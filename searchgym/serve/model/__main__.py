"""`python -m searchgym.serve.model --model-path DIR [--host H --port N ...]`."""

from searchgym.serve.model.app import main

if __name__ == "__main__":
    main()

"""`python -m searchgym.agents.server` was the model server's second front end; the server moved to serve/ and
its flags, spelt as before, to `searchgym serve model` and `python -m searchgym.serve.model` (issue 42). Run, it
says so and exits 2 (core/moved.py)."""

from searchgym.core.moved import exit_moved

MOVED_TO = "searchgym serve model"

if __name__ == "__main__":
    exit_moved("searchgym.agents.server", MOVED_TO, " (or `python -m searchgym.serve.model`)")

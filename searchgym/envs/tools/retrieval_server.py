"""`python -m searchgym.envs.tools.retrieval_server` was the retrieval server's second front end; the server moved to
serve/ and its flags, spelt as before, to `searchgym serve search` (issue 42). Run, it says so and
exits 2 (core/moved.py)."""

from searchgym.core.moved import exit_moved

MOVED_TO = "searchgym serve search"

if __name__ == "__main__":
    exit_moved("searchgym.envs.tools.retrieval_server", MOVED_TO)

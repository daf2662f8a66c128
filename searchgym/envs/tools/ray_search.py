"""`python -m searchgym.envs.tools.ray_search` was Ray Serve retrieval's second front end; the server moved to
serve/ and its flags, spelt as before, to `searchgym serve ray-search` (issue 42). Run, it says so and
exits 2 (core/moved.py)."""

from searchgym.core.moved import exit_moved

MOVED_TO = "searchgym serve ray-search"

if __name__ == "__main__":
    exit_moved("searchgym.envs.tools.ray_search", MOVED_TO)

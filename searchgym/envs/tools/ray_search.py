"""`python -m searchgym.envs.tools.ray_search` was Ray Serve retrieval's second front end; the server moved to
serve/ and its flags, spelt as before, to `searchgym serve ray-search` (issue 42). Run, this module says so and exits 2
as argparse does, so an old script stops naming the command to type instead of failing with "No module named"."""

import sys

MOVED_TO = "searchgym serve ray-search"

if __name__ == "__main__":
    print(
        f"python -m searchgym.envs.tools.ray_search: error: this is now `{MOVED_TO}`, with the same flags",
        file=sys.stderr,
    )
    sys.exit(2)

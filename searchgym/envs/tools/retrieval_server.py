"""`python -m searchgym.envs.tools.retrieval_server` was the retrieval server's second front end; the server moved to
serve/ and its flags, spelt as before, to `searchgym serve search` (issue 42). Run, this module says so and exits 2
as argparse does, so an old script stops naming the command to type instead of failing with "No module named"."""

import sys

MOVED_TO = "searchgym serve search"

if __name__ == "__main__":
    print(
        f"python -m searchgym.envs.tools.retrieval_server: error: this is now `{MOVED_TO}`, with the same flags",
        file=sys.stderr,
    )
    sys.exit(2)

"""`python -m searchgym.agents.server` was the model server's second front end; the server moved to serve/ and
its flags, spelt as before, to `searchgym serve model` and `python -m searchgym.serve.model` (issue 42). Run, this
module says so and exits 2 as argparse does, so an old script stops naming the command to type instead of
failing with "No module named"."""

import sys

MOVED_TO = "searchgym serve model"

if __name__ == "__main__":
    also = " (or `python -m searchgym.serve.model`)"
    print(
        f"python -m searchgym.agents.server: error: this is now `{MOVED_TO}`{also}, with the same flags",
        file=sys.stderr,
    )
    sys.exit(2)

"""`python -m searchgym`: the same command as `searchgym`, for environments where the script is not on PATH."""

import sys

from searchgym.cli import main

sys.exit(main())

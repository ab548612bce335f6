"""Judge your exercises: `python judge.py ch03` (see `python judge.py --help` and
judge/README.md)."""

import sys

from judge.cli import main

if __name__ == "__main__":
    sys.exit(main())

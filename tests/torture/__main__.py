"""`python -m tests.torture ...` from the repository root: see cli.py."""

import sys
from pathlib import Path

# The torture package imports the test helpers as the tests do: with tests/ on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torture.cli import main  # noqa: E402

sys.exit(main())

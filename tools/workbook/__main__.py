import sys

from .commands import main

sys.exit(main(sys.argv[1:]))

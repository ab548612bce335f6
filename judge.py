"""Judge your exercises: `python judge.py ch03` (see `python judge.py --help` and
judge/README.md); serve your code of a chapter: `python judge.py serve ch13` (see
`python judge.py serve --help` and judge/serve_command.py)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:  # a command of its own: its options are mostly the server's
        from judge.serve_command import main as serve

        sys.exit(serve(sys.argv[2:]))
    from judge.cli import main

    sys.exit(main())

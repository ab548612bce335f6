"""`python judge.py serve chNN [--notebook PATH | --file PATH] [server options]`: the
OpenAI-compatible server with a chapter's exercises of the learner in place of the reference, in all
three of its processes, for curl, LangChain or lm-eval.

The judge's side of the line: the engine (`python -m minisgl serve`) knows nothing of notebooks or
exercises. This command writes the learner's code as the judge would swap it (serving.py), points
the server's init hook at it, then runs the engine's own `serve` in this process with every option
it was not given to read (`--port`, `--model`, `--device`, ...: `python -m minisgl serve --help`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .serving import ServeError, serve_learner_code

EXIT_USAGE = 2  # as argparse and `python -m minisgl serve` exit for a usage error


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python judge.py serve",
        allow_abbrev=False,  # a server option such as --num-pages must pass through whole
        description="Serve a chapter's exercises of yours (the rest stays the reference) over the "
        "OpenAI-compatible HTTP API. Exercises still stubs stay the reference; the first line "
        "printed says which of yours serve.",
        epilog="Every other option goes to the server: see `python -m minisgl serve --help` "
        "(--port, --model, --device, --api-key, ...).",
    )
    p.add_argument("chapter", help="the chapter whose exercises serve, e.g. ch13 (any chapter)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--notebook", type=Path, help="take them from this notebook (default: notebooks/chNN_*)"
    )
    src.add_argument(
        "--file", type=Path, help="take them from this Python file (top-level defs, by name)"
    )
    return p


def main(argv: Sequence[str]) -> int:
    args, server_options = build_parser().parse_known_args(list(argv))
    try:
        print(serve_learner_code(args.chapter, args.notebook, args.file), flush=True)
    except ServeError as e:
        print(f"judge: {e}", file=sys.stderr)
        return EXIT_USAGE
    from minisgl.__main__ import main as minisgl_main

    return minisgl_main(["serve", *server_options])

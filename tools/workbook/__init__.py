"""One source, three products: chapters/chNN_*.md -> notebooks/ (learner), solutions/ (executed),
and the site's pages. `python -m tools.workbook --help` lists the commands; chapters/README.md
explains the source format."""

"""The teacher's side of the judge: `python judge.py grade chNN SUBMISSIONS...` judges a class's
notebooks, each in a sandbox of its own, and writes the grade book and the classroom formats.

One module per job: `discover` (which notebook is whose, for which chapter), `isolate` (the
sandbox one submission runs in), `run` (judging them in parallel, with a cache), `points` (the
points per exercise), `report` (CSV, JSON, HTML), `export` (Gradescope, JUnit), `classroom` (the
GitHub Classroom workflow), `cli` (the command line).
"""

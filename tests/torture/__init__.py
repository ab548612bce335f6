"""The scheduler torture test: seeded random workloads over the offline engine, checked against
invariants after every loop iteration, with a shrinker that cuts a failing workload down.

  prompts.py     the fixed prompt pool and its Hugging Face references
  workload.py    a workload as plain data, and the seeded generator
  runner.py      drives one workload through the engine, records what happened
  invariants.py  slot, page, lock and idle checks while it runs
  outcome.py     what every request must have received
  shrink.py      cuts a failing workload down to a minimal one
  cli.py         the long profile: `python -m tests.torture --minutes 3`
"""

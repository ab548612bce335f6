"""The hook every process of the server runs first: `MINISGL_SERVER_INIT=module:function`.

The server's workers are spawned, and the API server is often a process of its own (`python -m
minisgl serve` from a test's BackgroundServer): none of them inherits what was changed in the
process that started it. The judge (judge/serving.py) names its function here, so that the
learner's functions are put in place in all three processes, as they were in the test process.
The ranks of a tensor-parallel engine are spawned too, and run it for the same reason
(minisgl/distributed/ranks.py).
"""

from __future__ import annotations

import importlib

from minisgl.env import SERVER_INIT, SettingError


def run_server_init() -> None:
    target = SERVER_INIT.read()
    if not target:
        return
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise SettingError(f"{SERVER_INIT.name}={target!r}: use module:function")
    getattr(importlib.import_module(module), name)()

"""pytest hooks shared by every test: the --device option, GPU-only tests, and restoring the
environment switches tests flip. Helpers the tests import live in helpers.py."""

from __future__ import annotations

import os
from typing import List

import pytest
import torch

from extras import missing_reason
from minisgl import env
from minisgl.env import ENV
from minisgl.utils.threads import apply_thread_policy


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        choices=["cpu", "cuda", "auto"],
        help="device the engine runs on (default: cpu)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The engine's thread policy (minisgl/utils/threads.py), before any test computes: one thread
    # for the bundled model, whose matmuls are too small to split; MINISGL_THREADS overrides it.
    apply_thread_policy()
    dev = config.getoption("--device")
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    os.environ[env.TEST_DEVICE.name] = dev
    if dev == "cpu":
        # Triton kernels (chapters 17 and 19, the fused MoE) run on CPU tensors only in Triton's
        # interpreter, which each @triton.jit reads when its module is imported: before any test.
        os.environ.setdefault("TRITON_INTERPRET", "1")


# What one test process may hold at its peak: itself (torch, the bundled model, ~0.5 GB) and what a
# test starts beside it (a live server's three processes, two tensor-parallel ranks).
GB_PER_WORKER = 2.0


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: what `-n auto` means here
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One test process per core, as many as the memory available holds (GB_PER_WORKER each), and
    one on a GPU: its memory is one pool that every process's engine would size itself from."""
    if config.getoption("--device") != "cpu":
        return 1
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    available = _available_gb()
    if available is not None:
        workers = min(workers, int(available // GB_PER_WORKER))
    return max(1, workers or 1)


def _available_gb() -> float | None:
    """Memory available to new processes (Linux's MemAvailable), None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if env.TEST_DEVICE.read() != "cuda":
        skip = pytest.mark.skip(reason="needs --device cuda")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if "slow" not in (config.getoption("markexpr") or ""):  # as pyproject's markers say
        skip_slow = pytest.mark.skip(reason="slow: run with -m slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
    for item in items:
        for mark in item.iter_markers("needs_extra"):
            reason = missing_reason(mark.args[0], mark.args[1:])
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _restore_env():
    """Tests flip the engine's switches; put them back afterwards."""
    saved = {name: switch.value for name, switch in vars(ENV).items()}
    yield
    for name, value in saved.items():
        getattr(ENV, name).value = value


@pytest.fixture
def normal_loop():
    """Chapters 7-10 predate overlap scheduling: their modules use this fixture for every test
    (`pytestmark = pytest.mark.usefixtures("normal_loop")`)."""
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # _restore_env puts the old value back afterwards


@pytest.fixture(scope="module")
def server():
    """The three-process server on the bundled model (server_fixtures.SERVER_ARGS), started once
    for the test module that asks for it; a module that needs other settings defines its own."""
    from minisgl.server.background import BackgroundServer
    from server_fixtures import SERVER_ARGS, SERVER_ENV

    srv = BackgroundServer(*SERVER_ARGS, env=SERVER_ENV)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    """The official openai client of `server`, without retries (a test sees the first answer)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)

"""`python -m pytest -n auto` (the README's test command): one test process per core, as many as
the available memory holds, and one on a GPU (tests/conftest.py's pytest_xdist_auto_num_workers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import conftest


def config(device: str) -> SimpleNamespace:
    return SimpleNamespace(getoption=lambda name: {"--device": device}[name])


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)


def test_a_worker_per_core_where_memory_is_plenty(four_cores, monkeypatch):
    monkeypatch.setattr(conftest, "_available_gb", lambda: 64.0)
    assert conftest.pytest_xdist_auto_num_workers(config("cpu")) == 4


def test_no_more_workers_than_the_available_memory_holds(four_cores, monkeypatch):
    monkeypatch.setattr(conftest, "_available_gb", lambda: 2.5 * conftest.GB_PER_WORKER)
    assert conftest.pytest_xdist_auto_num_workers(config("cpu")) == 2
    monkeypatch.setattr(conftest, "_available_gb", lambda: 0.5)
    assert conftest.pytest_xdist_auto_num_workers(config("cpu")) == 1, "at least one"


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_one_worker_on_a_gpu(four_cores, monkeypatch, device):
    monkeypatch.setattr(conftest, "_available_gb", lambda: 64.0)
    assert conftest.pytest_xdist_auto_num_workers(config(device)) == 1


def test_the_available_memory_is_read_on_linux():
    available = conftest._available_gb()
    assert available is None or available > 0

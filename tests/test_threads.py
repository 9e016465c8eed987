"""The hf backend's thread count: the cores the process may use, less the work already on them."""
from __future__ import annotations

import os

import pytest

from harness.engine import threads


@pytest.mark.parametrize("cpu_max, cores", [
    (None, None),  # no cgroup v2 file: the affinity
    ("max 100000\n", None),  # no quota
    ("150000 100000\n", 1),  # 1.5 cores of quota: one whole core
    ("50000 100000\n", 1),  # under one core: still one thread
    ("400000 100000\n", 4),
])
def test_available_cores_is_the_affinity_capped_by_the_cgroup_quota(tmp_path, monkeypatch, cpu_max, cores):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    assert threads.available_cores(path) == (8 if cores is None else cores)


def test_a_quota_over_the_affinity_is_the_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    (tmp_path / "cpu.max").write_text("800000 100000\n")
    assert threads.available_cores(tmp_path / "cpu.max") == 2


@pytest.mark.parametrize("cores, load, expected", [(2, 0.2, 2), (2, 0.6, 2), (2, 1.0, 1), (2, 12.4, 1), (16, 3.4, 13), (1, 0.0, 1)])
def test_auto_threads_are_the_free_cores(cores, load, expected):
    assert threads.auto_threads(cores, load) == expected


def test_choose_takes_the_config_then_omp_num_threads_then_the_free_cores(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.1, 0.5, 0.2))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.choose(3) == (3, "backend.threads")
    assert threads.choose(0) == (1, "2 available cores at load 1.10")  # another busy process holds one core
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.choose(0) == (2, "OMP_NUM_THREADS")

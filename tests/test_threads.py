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


# --- an automatic count follows the machine while the engine computes --------------------------------

def _stat(path, busy: list[int], idle: int = 1000) -> None:
    """A /proc/stat whose CPUs 0.. have spent busy[i] jiffies in user time and `idle` idling."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"] + [f"cpu{i} {b} 0 0 {idle} 7 0 0 0 0 0" for i, b in enumerate(busy)]
    path.write_text("\n".join(lines) + "\n")


def test_busy_seconds_counts_the_given_cpus_less_idle_and_iowait(tmp_path):
    _stat(tmp_path / "stat", [100, 200, 400])
    tick = os.sysconf("SC_CLK_TCK")
    assert threads.busy_seconds({0, 2}, tmp_path / "stat") == pytest.approx(500 / tick)
    assert threads.busy_seconds({0}, tmp_path / "missing") is None


@pytest.mark.parametrize("cores, cpus, others, expected", [
    (2, 2, 0.1, 2), (2, 2, 0.49, 2), (2, 2, 0.67, 1), (2, 2, 1.0, 1), (2, 2, 3.5, 1),
    (2, 8, 1.0, 2),  # a quota of two cores on eight CPUs: a neighbour on one of the six others takes nothing
    (1, 1, 0.0, 1),
])
def test_threads_beside_leave_a_neighbours_core_to_it(cores, cpus, others, expected):
    assert threads.threads_beside(cores, cpus, others) == expected


def test_adaptive_drops_a_thread_when_a_neighbour_takes_a_core_and_takes_it_back_when_it_leaves(tmp_path, monkeypatch):
    import torch

    clock = {"wall": 0.0, "own": 0.0}
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(threads.time, "process_time", lambda: clock["own"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    set_to: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    _stat(stat, [0, 0])
    pace = threads.Adaptive(2, every_s=2.0, stat=stat)

    def after(seconds: float, ours: float, theirs: float) -> None:  # cores busy with this process and with others
        clock["wall"] += seconds
        clock["own"] += ours * seconds
        busy = threads.busy_seconds({0, 1}, stat) + (ours + theirs) * seconds
        _stat(stat, [round(busy * tick), 0])
        pace()

    after(1.0, 2.0, 0.8)  # within every_s of the last look: nothing read, nothing changed
    assert pace.threads == 2 and set_to == []
    after(1.0, 1.3, 0.7)  # a neighbour gets two thirds of a core beside two threads: it holds one
    assert pace.threads == 1 and set_to == [1]
    after(2.0, 1.0, 1.0)  # it still runs: one thread stays
    assert set_to == [1]
    after(2.0, 1.0, 0.1)  # it left
    assert pace.threads == 2 and set_to == [1, 2] and pace.used == {1, 2}  # the manifest names both


def test_adaptive_leaves_the_count_alone_without_a_proc_stat(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail("changed the count"))
    pace = threads.Adaptive(2, every_s=0.0, stat=tmp_path / "missing")
    pace()
    assert pace.threads == 2


def test_the_decoder_paces_after_each_prefill_chunk_and_each_decode_step(monkeypatch):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.engine import decode
    from harness.types import GenerationSettings

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    calls: list[int] = []
    decoder = decode.PrefixDecoder(LlamaForCausalLM(cfg).eval(), set(), "cpu", pace=lambda: calls.append(1))
    monkeypatch.setattr(decode, "PREFILL_CHUNK", 100)
    shared = [i % 60 for i in range(250)]
    decoder.decode([shared + [1, 2, 3], shared + [4, 5]], GenerationSettings(max_new_tokens=4, temperature=0.0),
                           [0, 0], batch_size=8, share_prefix=True)
    # prefill: the shared node in 3 chunks, each row's own tokens in 1; decode: 3 steps (the 4th token ends it)
    assert len(calls) == 3 + 2 + 3

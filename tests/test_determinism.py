"""Same config and seed: the same episodes, prompts and ids in separate processes (hash seeds differ)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

SNIPPET = """
import json
from tests.conftest import make_cfg
from harness.run import first_steps
from harness.types import canonical_json, sha256
plan = first_steps(make_cfg("scenario.other_companies=[0,2]", "experiment.replicates=2", "model.generation.temperature=0.7",
                          "condition=[none,status_tail,status_prose]"))
print(json.dumps([[s.sample_id, s.episode.id, s.request.seed, sha256(canonical_json(s.request.messages))] for s in plan]))
"""


def _plan(hash_seed: str) -> list:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", SNIPPET], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_plan_is_identical_across_processes():
    a, b = _plan("1"), _plan("2")
    assert a == b
    assert len(a) == len({row[0] for row in a}) == 24 * 3 * 2
    seeds = {}
    for sid, episode, seed, _ in a:  # conditions of one episode and replicate share a seed (paired arms)
        seeds.setdefault(episode, set()).add(seed)
    assert all(len(s) == 2 for s in seeds.values())

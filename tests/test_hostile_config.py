"""Hostile or clumsy command lines: keys on the command line, typo'd `+` keys, path escapes, huge
plans, empty targets and shards. Each is refused with exit status 2 and a message naming the key
(never repeating a secret), and a refused config writes nothing at all."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.config.compose import compose_config, group_options
from harness.errors import ConfigError
from harness.run import expanded_nodes
from harness.rundir.store import RunStore
from tests.conftest import run_cli

KEY = "sk-proj-Zx81hostileKEY0042"

REFUSED = [
    # (overrides, fragment the message must contain)
    ([f"+backend.api_key={KEY}"], "backend.api_key: keys are never part of the config"),
    ([f"backend.api_key={KEY}"], "backend.api_key: keys are never part of the config"),
    (["backend=openai", f"backend.api_key_env={KEY}"], "backend.api_key_env: must be the NAME"),
    (["backend=openai", "backend.api_key_env=Zx81hostileKEY0042abcdef"], "backend.api_key_env: must be the NAME"),
    # a key under a harmless name, or inside a URL, is a key all the same
    (["backend=openai", f"+backend.extra_body.x_key={KEY}"], "backend.extra_body.x_key: keys are never part of the config"),
    (["backend=openai", f"backend.base_url=http://u:{KEY}@localhost:1/v1"], "backend.base_url: keys are never part"),
    (["+scenario.episodes_per_cel=5", "+run.reprot=false"], "scenario.episodes_per_cel: unknown key"),
    (["+run.reprot=false"], "run.reprot: unknown key"),
    (["experiment.name=../../../escaped"], "experiment.name: not a directory name"),
    (["run.name=../escape"], "run.name: not a directory name"),
    (["scenario.episodes_per_cell=100000000"], "run.max_samples: the plan would hold 1,200,000,000 samples"),
    (["experiment.replicates=100000000"], "run.max_samples: the plan would hold 2,400,000,000 samples"),
    (["scenario.target="], "scenario.target: must name a target"),
]


@pytest.mark.parametrize("overrides, fragment", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_refused_before_anything_is_written(tmp_path: Path, overrides, fragment):
    root = tmp_path / "a" / "b" / "root"  # an escape of up to three levels still lands inside tmp_path
    res = run_cli(*overrides, f"run.root={root}", timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert fragment in res.stderr and "Traceback" not in res.stderr
    assert KEY not in res.stdout + res.stderr and "Zx81hostile" not in res.stdout + res.stderr
    assert not any(tmp_path.rglob("*")), sorted(tmp_path.rglob("*"))


def test_a_key_an_interpolation_resolves_to_is_refused_before_the_run_is_recorded(tmp_path: Path):
    """`${oc.env:...}` passes the command-line check (the text is no key); its value would reach .hydra/ and
    manifest.json, so the resolved config is checked too."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, pin_test_model

    env = {**os.environ, "STATUSBENCH_HOSTILE_VALUE": KEY}
    res = subprocess.run([sys.executable, "-m", "harness.run", *pin_test_model([
        "backend=openai", "+backend.extra_body.note=${oc.env:STATUSBENCH_HOSTILE_VALUE}", f"run.root={tmp_path}"])],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "backend.extra_body.note: keys are never part of the config" in res.stderr
    assert "Zx81hostile" not in res.stdout + res.stderr and "Traceback" not in res.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not any(p.name in ("manifest.json", "config.yaml") for p in written), written
    assert not any(KEY.encode() in p.read_bytes() for p in written)


def test_a_refused_second_writer_leaves_the_running_runs_files_alone(tmp_path: Path):
    run = tmp_path / "status_ablation" / "held"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- the running run's overrides\n")
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"text": "no"}) + "\n")
    with RunStore(run):  # another process holds the writer lock
        res = run_cli(f"run.root={tmp_path}", "run.name=held", "backend=scripted",
                      f"backend.path={completions}", "backend.match=order", timeout=120)
    assert res.returncode == 2 and "in use by another statusbench process" in res.stderr
    assert (run / ".hydra" / "overrides.yaml").read_text() == "- the running run's overrides\n"
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["overrides.yaml"]


def test_an_empty_shard_with_the_report_on_says_so(tmp_path: Path):
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"text": "no"}) + "\n")
    res = run_cli(f"run.root={tmp_path}", "backend=scripted", f"backend.path={completions}", "backend.match=order",
                  "run.shard=0/1000", "scenario.calls_made=[3]", "scenario.distractor_turns=[0]", timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "0 samples planned" in res.stdout and "holds none of the plan's episodes; no report" in res.stdout



def _alias_bomb(config_dir: Path) -> Path:
    """A "billion laughs" preset: 9 nested levels of 9 aliases, 9^9 strings once copied out."""
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    path = config_dir / "scenario" / "bomb.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("# @package _global_\nbomb:\n" + "\n".join(lines) + "\n")
    return path


def test_a_yaml_alias_bomb_is_refused_before_loading(tmp_path: Path):
    bomb = _alias_bomb(tmp_path / "conf")
    res = run_cli("--config-dir", str(tmp_path / "conf"), "scenario=bomb", f"run.root={tmp_path / 'root'}", timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"statusbench: error: {bomb}: its aliases expand to more than 1000000 nodes "
                                  "(a YAML alias bomb?); refused before loading")
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("text, nodes", [("base: &b {x: 1, y: 2}\nm: {<<: *b, z: 3}\n", 17),
                                         ("a: &a [1, *a]\n", float("inf")), ("", 0)])
def test_aliases_are_counted_as_copied(text: str, nodes: float):
    assert expanded_nodes(yaml.compose(text, Loader=yaml.SafeLoader)) == nodes


def test_a_run_root_that_cannot_hold_directories_is_one_line(tmp_path: Path):
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"text": "no"}) + "\n")
    res = run_cli("run.root=/proc", "run.name=r", "backend=scripted", f"backend.path={completions}",
                  "backend.match=order", timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == ("statusbench: error: run.root: cannot create the run directory "
                                  "/proc/status_ablation/r (No such file or directory); choose a writable run.root")


@pytest.mark.parametrize("key", ["run.name", "experiment.name"])
def test_a_name_longer_than_a_file_system_takes_is_refused(tmp_path: Path, key: str):
    name = "x" * 300
    res = run_cli(f"{key}={name}", f"run.root={tmp_path}", timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"statusbench: error: {key}: not a directory name: {name!r} "
                                  "(one path component, at most 255 bytes)")
    assert not any(tmp_path.iterdir())


TYPOS = [
    (["scenario.episodes_per_cel=1"], "scenario.episodes_per_cel: unknown key (did you mean scenario.episodes_per_cell?); "
                                      "scenario keys: action, call_results, calls_made, "),
    (["condition=[none,status_tial]"], "condition=status_tial: no such option (did you mean status_tail or "),
    (["model=smollm"], "model=smollm: no such option (did you mean smollm2-135m?); model options: claude-haiku-4.5, "),
]


@pytest.mark.parametrize("overrides, start", TYPOS, ids=[" ".join(o) for o, _ in TYPOS])
def test_a_typo_is_one_line_with_a_did_you_mean_and_the_choices(tmp_path: Path, overrides, start):
    res = run_cli(*overrides, f"run.root={tmp_path}", timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"statusbench: error: {start}") and res.stderr.count("\n") == 1, res.stderr
    assert "_schema" not in res.stderr and "+scenario" not in res.stderr and "Traceback" not in res.stderr
    assert not any(tmp_path.iterdir())


def test_tools_composing_a_config_say_the_same():
    with pytest.raises(ConfigError, match=r"^condition=status_tial: no such option \(did you mean status_tail"):
        compose_config(["condition=[none,status_tial]"])
    assert "status_tail" in group_options("condition") and not [o for o in group_options("condition") if "schema" in o]

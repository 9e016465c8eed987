"""A run directory holds one experiment: another config is refused before anything is written,
growing a run is an explicit, recorded switch, and the default run names keep the README's
examples apart."""
from __future__ import annotations

import json
from pathlib import Path

from harness.flow.fingerprint import fingerprint
from harness.run import plan_spec
from tests.conftest import make_cfg, run_cli


def _scripted(tmp_path: Path) -> list[str]:
    completions = tmp_path / "c.jsonl"
    completions.write_text('{"text": "I will not call again."}\n' * 24)
    return ["backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={tmp_path / 'results'}",
            "run.progress=false", "run.report=false"]


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.startswith(".lock") and p.name != "run.log"}


def test_the_readme_examples_write_two_clean_runs(tmp_path: Path):
    common = _scripted(tmp_path)
    assert run_cli(*common).returncode == 0
    assert run_cli(*common, "scenario=verizon_email").returncode == 0
    runs = sorted((tmp_path / "results" / "status_ablation").iterdir())
    assert [r.name for r in runs] == ["smollm2-135m-scripted-verizon_email", "smollm2-135m-scripted-xfinity"]
    for run, scenario in zip(runs, ("verizon_email", "xfinity")):
        records = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
        assert {r["scenario"] for r in records} == {scenario}
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["fingerprint"]["scenario.name"] == scenario and manifest["extensions"] == []


def test_another_config_into_one_run_is_refused_before_writing(tmp_path: Path):
    common = [*_scripted(tmp_path), "run.name=one"]
    assert run_cli(*common).returncode == 0
    run_dir = tmp_path / "results" / "status_ablation" / "one"
    before = _snapshot(run_dir)
    assert {"records.jsonl", "manifest.json", ".hydra/config.yaml"} <= set(before)
    for change in (["scenario=verizon_email"], ["model.generation.max_new_tokens=7"], ["experiment.replicates=2"]):
        res = run_cli(*common, *change)
        assert res.returncode == 2, res.stderr
        key = {"scenario=verizon_email": "scenario.name", "model.generation.max_new_tokens=7": "generation.max_new_tokens",
               "experiment.replicates=2": "experiment.replicates"}[change[0]]
        assert key in res.stderr and "run.name=" in res.stderr and "run.extend=true" in res.stderr
        assert "Traceback" not in res.stderr
        assert _snapshot(run_dir) == before  # records, manifest and Hydra's record untouched
    # operational keys are not part of the experiment
    res = run_cli(*common, "run.batch_size=3", "run.report=true")
    assert res.returncode == 0 and "24 already done, 0 new" in res.stdout


def test_extend_grows_a_run_on_purpose_and_is_recorded(tmp_path: Path):
    common = [*_scripted(tmp_path), "run.name=grow", "scenario.calls_made=[3]"]
    assert run_cli(*common).returncode == 0
    grown = [*common[:-1], "scenario.calls_made=[3,4]", "run.extend=true"]
    res = run_cli(*grown)
    assert res.returncode == 0 and "8 already done, 8 new" in res.stdout
    manifest = json.loads((tmp_path / "results" / "status_ablation" / "grow" / "manifest.json").read_text())
    assert manifest["fingerprint"]["scenario.calls_made"] == [3]
    assert [e["changed"] for e in manifest["extensions"]] == [["scenario.calls_made"]]
    assert manifest["extensions"][0]["fingerprint"]["scenario.calls_made"] == [3, 4]
    assert len({s["fingerprint"] for s in manifest["sessions"]}) == 2
    # both configs of the run are now its own: rerunning either resumes
    assert "16 already done, 0 new" in run_cli(*grown[:-1]).stdout
    assert "8 already done, 0 new" in run_cli(*common).stdout
    # extend grows a run; it does not turn it into another model's or decoding's run
    res = run_cli(*grown, "model.generation.temperature=0.7")
    assert res.returncode == 2 and "generation.temperature" in res.stderr


def test_fingerprint_leaves_out_operational_keys():
    base = fingerprint(plan_spec(make_cfg()))
    assert base == fingerprint(plan_spec(make_cfg("run.batch_size=2", "run.progress=false", "run.report=false", "run.shard=0/2",
                                        "run.retry_errors=true", "backend.batch_size=1", "run.name=x")))
    assert base != fingerprint(plan_spec(make_cfg("experiment.seed=1")))
    assert base != fingerprint(plan_spec(make_cfg("condition=[none]")))


# per backend: one override for each identity field (every config field it does not declare operational)
IDENTITY_CHANGES = {
    "hf": {"dtype": "backend.dtype=bfloat16"},
    "vllm": {"dtype": "backend.dtype=float16", "max_model_len": "backend.max_model_len=512", "seed": "backend.seed=1"},
    "openai": {"base_url": "backend.base_url=http://other:8000/v1", "served_model": "backend.served_model=other",
               "extra_body": "+backend.extra_body.top_k=5", "api": "backend.api=responses",
               "neutral_penalties": ("backend.api=completions", "backend.neutral_penalties=[frequency_penalty]")},
    "anthropic": {"base_url": "backend.base_url=http://other:8000", "served_model": "backend.served_model=other",
                  "extra_body": "+backend.extra_body.top_k=5", "cache": "backend.cache=none",
                  "thinking_display": "backend.thinking_display=omitted"},
    "scripted": {"match": "backend.match=order", "completions_sha256": "backend.path={other}"},  # another file's content
}
# identity fields a backend shows only where they apply, so the runs from before they existed keep their ids
CONDITIONAL = {"openai": {"api", "neutral_penalties"}}


def test_every_identity_field_of_every_backend_refuses_another_config(tmp_path: Path):
    from dataclasses import fields

    from harness.flow.fingerprint import admit
    from harness.run import first_steps
    from harness.rundir.layout import MANIFEST
    from harness.rundir.store import RunDirError

    completions, other = tmp_path / "c.jsonl", tmp_path / "other.jsonl"
    completions.write_text('{"text": "no"}\n')
    other.write_text('{"text": "yes"}\n')
    base_args = {"hf": [], "vllm": [], "openai": ["backend.api_key_env=null"], "anthropic": ["backend.api_key_env=null"],
                 "scripted": [f"backend.path={completions}"]}
    for backend, changes in IDENTITY_CHANGES.items():
        common = [f"backend={backend}", *base_args[backend]]
        cfg = make_cfg(*common)
        declared = {f.name for f in fields(cfg.backend)} - cfg.backend.OPERATIONAL - {"name", "path"}
        assert set(cfg.backend.identity()) - {"name"} == set(changes) - CONDITIONAL.get(backend, set()), backend  # a new field gets a row here
        assert declared <= set(changes), backend
        run_dir = tmp_path / backend
        run_dir.mkdir()
        (run_dir / MANIFEST).write_text(json.dumps({"fingerprint": fingerprint(plan_spec(cfg))}))
        ids = {s.request.sample_id for s in first_steps(cfg)}
        for key, override in changes.items():
            changed = make_cfg(*common, *(o.format(other=other) for o in (override if isinstance(override, tuple) else (override,))))
            try:
                admit(plan_spec(changed), False, run_dir, run_dir, "now")
            except RunDirError as exc:
                assert f"backend.{key}" in str(exc), (backend, key, str(exc))
            else:
                raise AssertionError(f"{backend}: changing {key} was admitted into the same run")
            assert ids.isdisjoint(s.request.sample_id for s in first_steps(changed)), (backend, key)
        # operational fields change neither the fingerprint nor a sample id
        for key in cfg.backend.OPERATIONAL - {"path"}:
            assert key not in fingerprint(plan_spec(cfg)) and f"backend.{key}" not in fingerprint(plan_spec(cfg))


def test_default_sample_ids_are_unchanged_by_identity_by_default():
    from harness.run import first_steps

    plan = first_steps(make_cfg())
    assert len(plan) == 24 and plan[0].request.sample_id == "4282e26065b89d86"

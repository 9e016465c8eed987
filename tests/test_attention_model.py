"""The attention probe on the embedded SmolLM2-135M: exact against the naive pass, inside a real
run (hf and scripted replay), and in the report."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.measure.attention import store
from tests.conftest import make_cfg, run_cli

pytestmark = pytest.mark.model
SHORT = ["scenario.calls_made=[3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
         "scenario.distractor_turns=[0]"]


def test_probe_equals_naive_attention_on_the_embedded_model(tmp_path: Path):
    from harness.backends import make_backend
    from harness.run import first_steps
    from harness.flow.probe import RunProbe
    from harness.measure.attention.probe import AttentionProbe, reference_masses
    from harness.types import Completion

    cfg = make_cfg(*SHORT, "condition=[status_tail]", "probe.attention=true", "probe.chunk_size=3")
    backend = make_backend(cfg.model, cfg.backend)
    sample = first_steps(cfg)[0]
    arrays = RunProbe(cfg.model, cfg.probe, backend, tmp_path).measure_one(sample, Completion(text="I will not call Xfinity again."))
    names = [str(n) for n in arrays["regions"]]
    assert "status" in names and "call_record_3" in names
    prompt = backend.tokenizer(backend.render(sample.request), add_special_tokens=False)["input_ids"]
    completion = backend.tokenizer("I will not call Xfinity again.", add_special_tokens=False)["input_ids"]
    args = (prompt, completion, arrays["token_regions"].tolist(), [1] * len(completion), len(names))
    naive = reference_masses(backend.model, *args)
    np.testing.assert_allclose(arrays["masses"], naive, atol=1e-4, rtol=0)
    rows = AttentionProbe(backend.model, chunk_size=4).run(*args, keep_rows=True).rows
    assert all(np.allclose(r.sum(-1), 1.0, atol=1e-5) for r in rows.values())


def test_the_probe_replays_on_the_generations_prompt_kv(tmp_path: Path):
    """After the hf backend generated, the probe starts from the prompts' KV of that generation (no
    forward over a whole prompt) and measures what a fresh prefill measures."""
    from harness.backends import make_backend
    from harness.run import first_steps
    from harness.flow.probe import RunProbe

    cfg = make_cfg(*SHORT, "condition=[none,status_tail]", "probe.attention=true", "model.generation.max_new_tokens=6")
    backend = make_backend(cfg.model, cfg.backend)
    probe = RunProbe(cfg.model, cfg.probe, backend, tmp_path)
    samples = first_steps(cfg)
    completions = backend.generate([s.request for s in samples])
    widths = []
    hook = backend.model.register_forward_pre_hook(lambda m, args, kw: widths.append(kw["input_ids"].shape[1]),
                                                   with_kwargs=True)
    try:
        reused = [probe.measure_one(s, c) for s, c in zip(samples, completions)]
    finally:
        hook.remove()
    prompt_lens = {len(a["token_regions"]) for a in reused}
    assert all(bool(a["prompt_kv_reused"]) for a in reused)
    assert widths and not prompt_lens & set(widths)  # chunks of the completion only, no prompt prefill
    probe.kv_source = None  # the same samples prefilled again
    for s, c, a in zip(samples, completions, reused):
        fresh = probe.measure_one(s, c)
        assert not bool(fresh["prompt_kv_reused"])
        np.testing.assert_allclose(a["masses"], fresh["masses"], atol=1e-4, rtol=0)
        np.testing.assert_allclose(a["strip"], fresh["strip"], atol=1e-5, rtol=0)


def test_run_with_the_probe_writes_masses_and_report(tmp_path: Path):
    args = [*SHORT, "model.generation.max_new_tokens=6", "probe.attention=true", f"run.root={tmp_path}", "run.name=probe"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "status_ablation" / "probe"
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    arrays = store.load(run_dir)
    assert len(records) == 2 and sorted(arrays) == sorted(r["sample_id"] for r in records)
    for r in records:
        a = arrays[r["sample_id"]]
        assert r["attention_ref"].endswith(f".npz#{r['sample_id']}") and "masses" not in json.dumps(r)
        np.testing.assert_array_equal(store.load_ref(run_dir, r["attention_ref"])["masses"], a["masses"])
        assert a["counts"].sum() == r["completion_tokens"] - (r["finish_reason"] == "stop")  # eos is not replayed
        assert json.loads(str(a["meta"]))["generated_by"] == "hf"
        np.testing.assert_allclose(a["masses"].sum(-1).sum(0), a["counts"].sum(), atol=1e-3)
    report = (run_dir / "report.md").read_text()
    assert "Attention: share per region" in report and "status bar gets" in report
    for name in ("attention_layers_by_region", "attention_share_by_region", "attention_token_strip"):
        assert (run_dir / f"{name}.png").exists()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["model"]["attention_probe"]["generated_by"] == "hf"

    written = store.parts(run_dir)
    assert written and all(p.parent.name == "attention" for p in written)
    again = run_cli(*args)
    assert again.returncode == 0 and "2 already done, 0 new" in again.stdout
    assert store.parts(run_dir) == written  # nothing new measured, no part added or rewritten


def test_sharded_run_with_the_probe_reports_attention(tmp_path: Path):
    """Each shard writes its own attention parts; the report over the run directory reads them all."""
    from analysis.report import write_report

    args = ["scenario.calls_made=[3,4]", *SHORT[1:], "model.generation.max_new_tokens=4", "probe.attention=true",
            f"run.root={tmp_path}", "run.name=sharded", "run.report=false"]
    for i in (0, 1):
        res = run_cli(*args, f"run.shard={i}/2")
        assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "status_ablation" / "sharded"
    records = [json.loads(x) for p in run_dir.glob("shards/*/records.jsonl") for x in p.read_text().splitlines()]
    assert len(records) == 4 and not (run_dir / "attention").exists()
    assert all(list((run_dir / "shards" / f"{i}-of-2" / "attention").glob("part-*.npz")) for i in (0, 1))
    assert sorted(store.load(run_dir)) == sorted(r["sample_id"] for r in records)
    for r in records:
        assert r["attention_ref"].startswith("shards/") and store.load_ref(run_dir, r["attention_ref"])["masses"].size
    write_report([run_dir])
    report = (run_dir / "report.md").read_text()
    assert "Attention: share per region" in report and "status bar gets" in report


def test_scripted_completions_are_replayed_with_the_model_weights(tmp_path: Path):
    lines = tmp_path / "completions.jsonl"
    lines.write_text(json.dumps({"text": "<think>\nThree calls.\n</think>\n\nNo more calls."}) + "\n"
                     + json.dumps({"text": "Calling again."}) + "\n")
    result = run_cli(*SHORT, "backend=scripted", f"backend.path={lines}", "backend.match=order", "probe.attention=true",
                     f"run.root={tmp_path}", "run.name=replay", "run.report=false")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "status_ablation" / "replay"
    records = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    arrays = store.load(run_dir)
    for r in records:
        assert r["scripted"] and r["backend"] == "scripted" and r["attention_ref"]
        meta = json.loads(str(arrays[r["sample_id"]]["meta"]))
        assert meta["generated_by"] == "scripted" and "smollm2" in meta["replayed_with"]["path"]
    thinking = [arrays[r["sample_id"]]["counts"][0] for r in records]
    assert sorted(t > 0 for t in thinking) == [False, True]

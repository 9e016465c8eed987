"""Files a user or a model hands us, however hostile: every text round-trips, every bad line is
refused naming file, line and field, and nothing already written is lost or rewritten."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scenarios
from analysis.load import load_run
from harness.backends.scripted import load_lines
from harness.config import ConfigError
from harness.store import RunDirError, RunStore, read_jsonl
from harness.types import Record
from tests.conftest import make_cfg, run_cli

# every code point a JSON string can carry, line and paragraph separators and NEL included
TEXT = st.text(st.characters(codec="utf-8"), max_size=60) | st.sampled_from(["a\u2028b", "\u2029", "x\x85y", "\r\n\x0b\x0c\x1c\x1d\x1e"])
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _record(sample_id: str, text: str, reasoning: str = "") -> Record:
    return Record(sample_id=sample_id, episode_id="e", scenario="s", family="f", params={"note": text}, condition="none",
                  condition_config={}, model="m", model_path=None, backend="scripted", generation={}, replicate=0, seed=0,
                  prompt_sha256="p" + sample_id, prompt_tokens=1, cached_prompt_tokens=None, completion_tokens=1,
                  thinking_tokens=0, answer_tokens=1, text=text, reasoning=reasoning, tool_calls=[], label="refused",
                  correct=True, expected="refused", latency_s=0.1, finish_reason="stop", error=None, scripted=True,
                  created_at="now")


@SETTINGS
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_any_unicode_round_trips_through_records_and_prompts(tmp_path_factory, texts):
    run = tmp_path_factory.mktemp("run")
    records = [_record(f"s{i}", t, reasoning=t[::-1]) for i, t in enumerate(texts)]
    prompts = [{"prompt_sha256": r.prompt_sha256, "messages": [{"role": "user", "content": r.text}], "tools": [],
                "rendered": r.text} for r in records]
    with RunStore(run) as store:
        store.append(records, prompts)
    with RunStore(run) as store:  # a resume reads both files back
        assert store.done_ids() == {r.sample_id for r in records}
    # lone surrogates are written as their JSON escape: compare through Python's own round trip
    expect = [json.loads(json.dumps(asdict(r))) for r in records]
    assert read_jsonl(run / "records.jsonl") == expect
    assert [p["rendered"] for p in read_jsonl(run / "prompts.jsonl")] == [r.text for r in records]
    assert list(load_run(run, cache=False)["text"]) == [r.text for r in records]


@SETTINGS
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_any_unicode_round_trips_through_scripted_and_trace_files(tmp_path_factory, texts):
    d = tmp_path_factory.mktemp("files")
    scripted = d / "completions.jsonl"
    scripted.write_text("".join(json.dumps({"text": t, "reasoning": t}, ensure_ascii=False) + "\n" for t in texts),
                        encoding="utf-8", errors="surrogatepass")
    assert [r["text"] for r in load_lines(str(scripted))] == texts
    traces = d / "traces.jsonl"
    rule = {"tool": "ping", "arg": "host", "target": "h", "limit": 1}
    traces.write_text("".join(json.dumps({"id": f"t{i}", "messages": [{"role": "system", "content": t},
                                                                     {"role": "user", "content": t}], "rule": rule},
                                         ensure_ascii=False) + "\n" for i, t in enumerate(texts)),
                      encoding="utf-8", errors="surrogatepass")
    episodes = scenarios.build_episodes(make_cfg("scenario=traces", f"scenario.path={traces}").scenario)
    assert [ep.messages[1]["content"] for ep in episodes] == texts


def test_a_run_whose_output_holds_separators_resumes_and_reports(tmp_path: Path):
    odd = "line\u2028para\u2029nel\x85end"
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"text": odd}, ensure_ascii=False) + "\n" * 1, encoding="utf-8")
    args = ["backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={tmp_path}",
            "run.name=sep", "scenario.calls_made=[3]", "scenario.distractor_turns=[0]", "scenario.episodes_per_cell=1"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert "0 new" in again.stdout
    run = next(tmp_path.rglob("records.jsonl")).parent
    rows = read_jsonl(run / "records.jsonl")
    assert rows[0]["text"] == odd and len(rows) == len((run / "records.jsonl").read_bytes().split(b"\n")) - 1
    assert (run / "report.md").exists()


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\r", "\x0b", "\x1e"])
def test_lines_end_at_newline_only(sep):
    from harness.jsonl import iter_lines

    text = json.dumps({"t": f"a{sep}b"}, ensure_ascii=False) + "\n" + json.dumps({"t": 2}) + "\n"
    for data in (text, text.encode("utf-8")):
        assert list(iter_lines(data, "f")) == [(1, {"t": f"a{sep}b"}), (2, {"t": 2})]

"""Files a user or a model hands us, however hostile: every text round-trips, every bad line is
refused naming file, line and field, and nothing already written is lost or rewritten."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scenarios
from analysis.load import load_run
from harness.backends.scripted import load_lines
from harness.errors import ConfigError
from harness.rundir.records import read_record_rows
from harness.rundir.store import RunDirError, RunStore, read_jsonl
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
    with RunStore(run):  # a resume reads both files back
        assert {r["sample_id"] for r in read_record_rows(run / "records.jsonl")} == {r.sample_id for r in records}
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
    from harness.io.jsonl import iter_lines

    text = json.dumps({"t": f"a{sep}b"}, ensure_ascii=False) + "\n" + json.dumps({"t": 2}) + "\n"
    for data in (text, text.encode("utf-8")):
        assert list(iter_lines(data, "f")) == [(1, {"t": f"a{sep}b"}), (2, {"t": 2})]


# --- files a user hands us: refused at load, naming file, line and field -----------------------------

BAD_SCRIPTED = [
    # (line 2 of the file, fragment of the message)
    (b"[" * 100_000 + b"]" * 100_000, "line 2 is nested too deeply"),
    (b'{"text": "caf\xe9"}', "line 2 is not valid UTF-8"),
    (b'{"text": "x", "replicate": ' + b"7" * 5000 + b"}", "line 2 is not valid JSON (Exceeds the limit"),
    (b'{"text": "x", "tool_calls": 5}', "line 2: field 'tool_calls' must be list"),
    (b'{"text": "x", "tool_calls": [5]}', "line 2: field 'tool_calls' item 0 must be an object"),
    (b'{"text": "x", "usage": "abc"}', "line 2: field 'usage' must be dict"),
    (b'{"text": "x", "usage": {"prompt_tokens": "abc"}}', "line 2: usage.prompt_tokens must be a token count"),
    (b'{"text": "x", "usage": {"completion_tokens": -3}}', "line 2: usage.completion_tokens must be a token count"),
    (b'{"text": "x", "usage": {"completion_tokens": 1.5}}', "line 2: usage.completion_tokens must be a token count"),
    (b'{"text": "x", "usage": {"prompt_tokens": NaN}}', "line 2 is not valid JSON (NaN is not JSON)"),
    (b'{"text": "x", "usage": {"prompt_tokens": Infinity}}', "line 2 is not valid JSON (Infinity is not JSON)"),
    (b'{"text": "x", "usage": {"prompt_tokens": 1e400}}', "line 2: usage.prompt_tokens must be a token count"),
    (b'{"episode_id": ["a"], "condition": "none", "text": "x"}', "line 2: field 'episode_id' must be str"),
    (b'{"text": 5}', "line 2: field 'text' must be str"),
    (b'{"text": "x", "replicate": true}', "line 2: field 'replicate' must be int"),
    (b'"just a string"', "line 2 must be a JSON object, got str"),
    (b'["a", "list"]', "line 2 must be a JSON object, got list"),
    (b"null", "line 2 must be a JSON object, got null"),
]


@pytest.mark.parametrize("line, fragment", BAD_SCRIPTED, ids=[f[:40] for _, f in BAD_SCRIPTED])
def test_bad_scripted_lines_are_named(tmp_path: Path, line: bytes, fragment: str):
    path = tmp_path / "completions.jsonl"
    path.write_bytes(b'{"text": "fine"}\n' + line + b"\n")
    with pytest.raises(ConfigError) as err:
        load_lines(str(path))
    assert str(path) in str(err.value) and fragment in str(err.value), str(err.value)


RULE = {"tool": "ping", "arg": "host", "target": "h", "limit": 1}
MESSAGES = [{"role": "user", "content": "hi"}]
BAD_TRACES = [
    ({"messages": MESSAGES, "rule": {**RULE, "limit": -1}}, "field 'rule.limit' must be an integer >= 1, got -1"),
    ({"messages": MESSAGES, "rule": {**RULE, "limit": True}}, "field 'rule.limit' must be an integer >= 1, got True"),
    ({"messages": MESSAGES, "rule": {**RULE, "limit": "2"}}, "field 'rule.limit' must be an integer >= 1"),
    ({"messages": MESSAGES, "rule": {**RULE, "target": ""}}, "field 'rule.target' must be a non-empty string"),
    ({"messages": MESSAGES, "rule": "abc"}, "field 'rule'"),
    ({"messages": MESSAGES, "rule": [1]}, "field 'rule' must be an object"),
    ({"messages": 5, "rule": RULE}, "field 'messages' must be a list of chat messages, got int"),
    ({"messages": [{"role": "user", "content": 5}], "rule": RULE}, "messages[0].content must be a string"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": 5}, {"role": "user", "content": "q"}],
      "rule": RULE}, "messages[1].tool_calls must be a list of calls"),
    ({"messages": MESSAGES, "rule": RULE, "tools": "abc"}, "field 'tools'"),
    ({"messages": MESSAGES, "rule": RULE, "id": ["a"]}, "field 'id' must be a string or an integer"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {
        "name": "ping", "arguments": '{"host": ' + "[" * 50_000 + "]" * 50_000 + "}"}}]}, {"role": "user", "content": "q"}],
      "rule": RULE}, "arguments are not readable JSON (RecursionError"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {
        "name": "ping", "arguments": '{"host": ' + "9" * 5000 + "}"}}]}, {"role": "user", "content": "q"}],
      "rule": RULE}, "arguments are not readable JSON (ValueError"),
    ({"family": "xfinity", "expected": "refused", "messages": "[]"}, "exported episode lacks field 'id'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "q", "x": json.loads("[" * 950 + "]" * 950)}]}],
      "rule": RULE}, "nested too deeply"),
]


@pytest.mark.parametrize("row, fragment", BAD_TRACES, ids=[f[:40] for _, f in BAD_TRACES])
def test_bad_trace_rows_are_named(tmp_path: Path, row, fragment, request):
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps({"messages": MESSAGES, "rule": RULE}) + "\n" + json.dumps(row) + "\n")
    # Python's default recursion limit, as a run has it: something earlier in the session may have raised
    # it, under which the deep row parses
    request.addfinalizer(lambda limit=sys.getrecursionlimit(): sys.setrecursionlimit(limit))
    sys.setrecursionlimit(1000)
    with pytest.raises(ConfigError) as err:
        scenarios.build_episodes(make_cfg("scenario=traces", f"scenario.path={path}").scenario)
    assert f"{path} line 2" in str(err.value) and fragment in str(err.value), str(err.value)


def test_a_bad_user_file_writes_nothing(tmp_path: Path):
    completions = tmp_path / "c.jsonl"
    completions.write_text('{"text": "x", "usage": {"prompt_tokens": "abc"}}\n')
    res = run_cli("backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={tmp_path / 'out'}")
    assert res.returncode == 2 and "line 1: usage.prompt_tokens must be a token count" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("edited")
    completions = root / "c.jsonl"
    completions.write_text(json.dumps({"text": "I won't call again."}) + "\n")
    args = ["backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={root}", "run.name=r",
            "scenario.calls_made=[3]", "scenario.distractor_turns=[0]", "run.report=false"]
    assert run_cli(*args).returncode == 0
    return root / "status_ablation" / "r", args


EDITS = [
    ("records.jsonl", lambda t: t + '{"episode_id": "e", "label": "refused"}\n', "records.jsonl line 9 lacks field 'sample_id'"),  # after 8 records
    ("records.jsonl", lambda t: t.replace("\n", "\nnull\n", 1), "records.jsonl line 2 must be a JSON object, got null"),
    ("manifest.json", lambda t: t[: len(t) // 2], "manifest.json line"),
]


@pytest.mark.parametrize("name, edit, fragment", EDITS, ids=[f for _, _, f in EDITS])
def test_a_hand_edited_run_is_named_and_left_alone(tmp_path: Path, finished_run, name, edit, fragment):
    import shutil

    src, args = finished_run
    run = tmp_path / "status_ablation" / "r"
    shutil.copytree(src, run)
    (run / name).write_text(edit((run / name).read_text()))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and not p.name.startswith(".lock")}
    res = run_cli(*[a if not a.startswith("run.root=") else f"run.root={tmp_path}" for a in args])
    assert res.returncode == 2 and fragment in res.stderr and "Traceback" not in res.stderr, res.stderr
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and not p.name.startswith(".lock")}
    assert after == before  # nothing rewritten
    if name == "records.jsonl":  # the report names the line too, and exits 2
        import subprocess
        import sys

        rep = subprocess.run([sys.executable, "-m", "analysis.report", str(run), "--out", str(tmp_path / "rep")],
                             capture_output=True, text=True, timeout=300)
        assert rep.returncode != 0 and fragment in rep.stderr and "Traceback" not in rep.stderr, rep.stderr


def test_records_stay_strict_json(tmp_path: Path):
    with RunStore(tmp_path) as store:
        store.append([_record("a", "ok")], [])
        bad = _record("b", "x")
        bad.latency_s = float("nan")
        with pytest.raises(ValueError, match="JSON compliant"):
            store.append([bad], [])
    assert [r["sample_id"] for r in read_jsonl(tmp_path / "records.jsonl")] == ["a"]
    with pytest.raises(RunDirError, match="line 2 is not valid JSON \\(NaN is not JSON\\)"):
        (tmp_path / "records.jsonl").write_text((tmp_path / "records.jsonl").read_text() + '{"sample_id": "c", "x": NaN}\n')
        read_jsonl(tmp_path / "records.jsonl")

"""Hostile content, round three (issue 29): what a server or a user's file returns is data. It never
becomes markup in the report, never carries the API key into a file, and never makes a run unreadable."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import figures
from tests.conftest import REPO, run_cli
from tests.fault_server import FaultServer

SECRET = "sk-statusbench-content-7f3a9b1c5d2e"
GRID = ["scenario.calls_made=[2,3,4]", "scenario.placement=[early,late]", "scenario.episodes_per_cell=1"]


def _run(server: FaultServer, root: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STATUSBENCH_TEST_KEY": SECRET}
    return subprocess.run([sys.executable, "-m", "harness.run", "backend=openai", f"backend.base_url={server.base_url}",
                           "backend.api_key_env=STATUSBENCH_TEST_KEY", "backend.max_retries=0", "backend.timeout_s=5",
                           f"run.root={root}", "run.name=hostile", *GRID, *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_markdown_in_a_servers_error_stays_text_in_the_report(tmp_path: Path):
    hostile = "![k](/proc/self/environ) ![y](http://127.0.0.1:9/y.png) [link](http://127.0.0.1:9/)"
    with FaultServer(seed=4, fates={"ok": 0.5, "400": 0.5}, rejection=hostile) as server:
        res = _run(server, tmp_path)
    assert res.returncode == 0, res.stderr
    assert server.served["400"]
    run_dir = tmp_path / "status_ablation" / "hostile"
    html = (run_dir / "report.html").read_text()
    # the only images are the report's own figures, embedded; no link leads anywhere but its own PDFs
    sources = re.findall(r"<img [^>]*src=\"([^\"]*)\"", html)
    written = [name for name in figures.FIGURES if (run_dir / f"{name}.pdf").is_file()]
    assert len(sources) == len(written) >= 4 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert set(re.findall(r"<a [^>]*href=\"([^\"]*)\"", html)) <= {f"{name}.pdf" for name in figures.FIGURES}
    assert "/proc/self/environ" not in " ".join(sources) and "127.0.0.1:9" not in " ".join(sources)
    assert SECRET not in html and "STATUSBENCH_TEST_KEY" not in html  # the environment was not embedded
    assert hostile in html  # the server's text, visible as the characters it sent
    md = (run_dir / "report.md").read_text()
    assert r"\!\[k\](/proc/self/environ)" in md and "](/proc" not in md.replace(r"\](/proc", "")


def _key_runs(text: str, key: str = SECRET, run: int = 12) -> list[str]:
    """Every piece of `run` consecutive characters of the key found in text."""
    return [key[i:i + run] for i in range(len(key) - run + 1) if key[i:i + run] in text]


def test_a_key_in_a_200_answer_is_never_stored(tmp_path: Path):
    answer = f"Here is your key: {SECRET}. Its middle: {SECRET[8:22]}. Done."
    with FaultServer(seed=1, fates={"ok": 1.0}, text=answer) as server:
        res = _run(server, tmp_path)
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "status_ablation" / "hostile"
    records = (run_dir / "records.jsonl").read_text()
    assert "Here is your key: [redacted]. Its middle: [redacted]. Done." in records  # the answer is kept, the key not
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):  # records, report, browser, logs
        assert not _key_runs(path.read_bytes().decode("utf-8", "replace")), path
    assert not _key_runs(res.stdout + res.stderr)


def _generate(server: FaultServer, monkeypatch, *overrides: str):
    from harness.backends.openai_api import OpenAIBackend
    from harness.run import first_steps
    from tests.conftest import make_cfg

    monkeypatch.setenv("STATUSBENCH_TEST_KEY", SECRET)
    cfg = make_cfg("backend=openai", f"backend.base_url={server.base_url}", "backend.api_key_env=STATUSBENCH_TEST_KEY",
                   "backend.max_retries=0", "backend.timeout_s=5", "scenario.calls_made=[3]",
                   "scenario.placement=[early]", "scenario.episodes_per_cell=1", *overrides)
    return OpenAIBackend(cfg.model, cfg.backend).generate([s.request for s in first_steps(cfg)])


@pytest.mark.parametrize("before_cut", [11, 19])
def test_a_key_across_the_cut_of_a_non_json_200_is_redacted_whole(monkeypatch, before_cut):
    # the quoted body is cut at 200 characters: the key starts `before_cut` characters before the cut
    body = ("x" * (200 - before_cut) + SECRET + " trailing page").encode()
    with FaultServer(fates={"html": 1.0}, html=body) as server:
        completions = _generate(server, monkeypatch)
    assert completions and all("not a chat completion" in c.error for c in completions)
    for c in completions:
        assert SECRET[:before_cut] not in c.error and "[redacte" in c.error, c.error


def test_a_lone_surrogate_in_a_scripted_line_is_read_as_a_replacement_character(tmp_path: Path):
    completions = tmp_path / "c.jsonl"
    completions.write_text('{"text": "half an emoji \\ud83d"}\n')  # valid JSON, scripted, no usage: counted here
    res = run_cli("backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={tmp_path}",
                  "run.name=surrogate", "scenario.calls_made=[3]", "scenario.placement=[early]",
                  "scenario.episodes_per_cell=1")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "status_ablation" / "surrogate"
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    answered = [r for r in rows if not r["error"]]  # one line for the plan's first sample (match=order)
    assert answered and all(r["text"] == "half an emoji \ufffd" and r["scripted"] for r in answered)
    assert all(r["completion_tokens"] for r in answered)  # the token counter read it
    for module, args in (("analysis.report", [str(run), "--out", str(tmp_path / "r")]),
                         ("analysis.view", [str(run), "--out", str(tmp_path / "v")]),
                         ("analysis.regress", [str(run), str(run)])):
        out = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (module, out.stderr)
    assert "half an emoji \ufffd" in (tmp_path / "v" / "samples.html").read_text(encoding="utf-8")


def test_a_lone_surrogate_from_a_server_is_a_replacement_character(monkeypatch):
    with FaultServer(fates={"ok": 1.0}, text="half an emoji \ud83d") as server:  # sent as the escape \ud83d
        completions = _generate(server, monkeypatch)
    assert completions and all(c.text == "half an emoji \ufffd" and not c.error for c in completions)


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 5000}},
    {"prompt_tokens": True, "completion_tokens": 3},
    {"prompt_tokens": 10, "completion_tokens": False},
    {"prompt_tokens": -10, "completion_tokens": 3},
    {"prompt_tokens": 10.5, "completion_tokens": 3},
    {"prompt_tokens": "10", "completion_tokens": 3},
    {"prompt_tokens": 10, "completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 7}},
])
def test_invalid_usage_makes_the_counts_unknown_never_a_wrong_number(monkeypatch, usage):
    from harness.measure.cost import cost_usd
    from tests.conftest import make_cfg

    with FaultServer(fates={"ok": 1.0}, usage=usage) as server:
        completions = _generate(server, monkeypatch)
    model = make_cfg("model.price_input_per_mtok=3", "model.price_cached_input_per_mtok=1",
                     "model.price_output_per_mtok=15").model
    for c in completions:
        assert not c.error and c.text  # the answer is kept
        assert (c.prompt_tokens, c.cached_prompt_tokens, c.completion_tokens, c.thinking_tokens, c.answer_tokens) == (None,) * 5
        assert cost_usd(model, c) is None


def test_a_cost_is_never_negative():
    from harness.measure.cost import cost_usd
    from harness.types import Completion
    from tests.conftest import make_cfg

    model = make_cfg("model.price_input_per_mtok=3", "model.price_output_per_mtok=15").model
    assert cost_usd(model, Completion(prompt_tokens=10, cached_prompt_tokens=5000, completion_tokens=3)) is None
    assert cost_usd(model, Completion(prompt_tokens=10, cached_prompt_tokens=4, completion_tokens=3)) == pytest.approx((10 * 3 + 3 * 15) / 1e6)


@pytest.mark.parametrize("stream", [False, True])
def test_a_gzip_bomb_is_an_error_record_and_memory_stays_bounded(monkeypatch, stream):
    import tracemalloc

    unpacked = 64_000_000  # ~64 KB on the wire
    with FaultServer(fates={"gzip_bomb": 1.0}, bomb_bytes=unpacked) as server:
        tracemalloc.start()
        try:
            completions = _generate(server, monkeypatch, "backend.max_response_bytes=2000000", f"backend.stream={stream}")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert len(server.bomb) < unpacked / 500
    assert completions and all("larger than backend.max_response_bytes=2000000" in c.error for c in completions), completions[0].error
    assert peak < unpacked / 4, peak  # the body was never held whole (one request at a time holds ~3 MB at most)


def test_a_response_in_an_encoding_not_asked_for_is_refused(monkeypatch):
    import httpx2

    from harness.backends.openai_api import OpenAIBackend
    from harness.run import first_steps
    from tests.conftest import make_cfg

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert request.headers["accept-encoding"] == "gzip, deflate"
        return httpx2.Response(200, content=b"\x00" * 64, headers={"content-encoding": "br"})

    cfg = make_cfg("backend=openai", "backend.api_key_env=null", "backend.max_retries=0", "scenario.calls_made=[3]",
                   "scenario.placement=[early]", "scenario.episodes_per_cell=1")
    backend = OpenAIBackend(cfg.model, cfg.backend, transport_factory=lambda: httpx2.MockTransport(handler))
    completions = backend.generate([s.request for s in first_steps(cfg)])
    assert completions and all("content-encoding 'br' was not asked for" in c.error for c in completions)


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("typed")
    completions = root / "c.jsonl"
    completions.write_text(json.dumps({"text": "I won't call again."}) + "\n")
    res = run_cli("backend=scripted", f"backend.path={completions}", "backend.match=order", f"run.root={root}",
                  "run.name=r", "scenario.calls_made=[3]", "scenario.distractor_turns=[0]", "run.report=false")
    assert res.returncode == 0, res.stderr
    return root / "status_ablation" / "r"


def _edited(src: Path, dst: Path, field: str, raw: str) -> Path:
    """A copy of the run whose second record has `field` set to the JSON text `raw`."""
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("records.parquet"))
    lines = (dst / "records.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row[field] = "@@"
    lines[1] = json.dumps(row).replace('"@@"', raw) + "\n"
    (dst / "records.jsonl").write_text("".join(lines))
    return dst


@pytest.mark.parametrize("field, raw, fragment", [
    ("correct", '"false"', "field 'correct' must be bool"),
    ("latency_s", "1e400", "field 'latency_s' must be a finite number >= 0"),
    ("prompt_tokens", '"12"', "field 'prompt_tokens' must be int or null"),
    ("replicate", '"0"', "field 'replicate' must be int"),
    ("cost_usd", "-0.5", "field 'cost_usd' must be a finite number >= 0"),
    ("label", "null", "field 'label' must be str"),
])
def test_records_are_typed_at_load_naming_file_and_line(scripted_run, tmp_path, field, raw, fragment):
    from analysis.load import load_records
    from harness.rundir.store import RunDirError

    run = _edited(scripted_run, tmp_path / "r", field, raw)
    with pytest.raises(RunDirError, match=re.escape(f"{run / 'records.jsonl'} line 2: {fragment}")):
        load_records([run])


@pytest.mark.parametrize("field, raw", [("correct", '"false"'), ("latency_s", "1e400")])
def test_analysis_refuses_a_mistyped_record_in_one_line(scripted_run, tmp_path, field, raw):
    run = _edited(scripted_run, tmp_path / "r", field, raw)
    load_records_first = {"analysis.report": [str(run), "--out", str(tmp_path / "rep")],
                          "analysis.view": [str(run), "--out", str(tmp_path / "view")],
                          "analysis.regress": [str(scripted_run), str(run)]}
    for module, args in load_records_first.items():
        res = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert res.returncode == 2, (module, res.stdout, res.stderr)
        assert f"records.jsonl line 2: field '{field}'" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr

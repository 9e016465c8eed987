"""transformers on CPU or GPU: chat-template rendering, batched left-padded decoding.

The decode loop is ours rather than `model.generate` so that each sample draws from its own seeded
generator: a sampled output depends on its seed only, not on which batch it landed in.
"""
from __future__ import annotations

import inspect
import time
from typing import Any

from harness import models
from harness.config import HFBackendConfig, ModelConfig
from harness.render import split_thinking, template_supports_tools, to_hermes
from harness.types import Completion, GenerationSettings, Request



class HFBackend:
    name = "hf"

    def __init__(self, model_cfg: ModelConfig, cfg: HFBackendConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.model_cfg = cfg, model_cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.path, self.revision = models.resolve(model_cfg)
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
        dtype = "auto" if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, revision=self.revision if not model_cfg.gguf_package else None)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.path, revision=self.revision if not model_cfg.gguf_package else None, dtype=dtype).to(self.device).eval()
        template = self.tokenizer.chat_template if isinstance(self.tokenizer.chat_template, str) else None
        fmt = model_cfg.tool_format
        self.native_tools = fmt == "native" or (fmt == "auto" and template_supports_tools(template))
        gen_eos = self.model.generation_config.eos_token_id
        eos = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(eos)
        vocab = self.tokenizer.get_vocab()
        self.think_end_id = vocab.get("</think>")
        # transformers 5.2x renamed forward's past_key_values to cache
        self.cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "revision": self.revision, "device": self.device,
                "dtype": str(self.model.dtype), "native_tools": self.native_tools}

    def render(self, request: Request) -> str:
        messages = request.messages if self.native_tools else to_hermes(request.messages, request.tools)
        return self.tokenizer.apply_chat_template(
            messages, tools=request.tools if self.native_tools else None, tokenize=False,
            add_generation_prompt=True, **dict(self.model_cfg.chat_template_kwargs))

    def generate(self, requests: list[Request]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        ready: list[tuple[int, str, list[int]]] = []
        for i, req in enumerate(requests):
            try:
                text = self.render(req)
            except Exception as exc:  # a template's raise_exception is a per-sample outcome, not a crash
                out[i] = Completion(error=f"template: {type(exc).__name__}: {exc}")
                continue
            ready.append((i, text, self.tokenizer(text, add_special_tokens=False)["input_ids"]))
        # similar lengths together keep padding small; one generation config per decode call
        ready.sort(key=lambda r: (_gen_key(requests[r[0]].generation), len(r[2])))
        for start in range(0, len(ready), self.cfg.batch_size):
            chunk = ready[start:start + self.cfg.batch_size]
            groups: dict[tuple, list] = {}
            for item in chunk:
                groups.setdefault(_gen_key(requests[item[0]].generation), []).append(item)
            for items in groups.values():
                gen = requests[items[0][0]].generation
                t0 = time.perf_counter()
                outputs = self._decode([ids for _, _, ids in items], gen, [requests[i].seed for i, _, _ in items])
                latency = time.perf_counter() - t0
                for (i, text, ids), (tokens, finish) in zip(items, outputs):
                    out[i] = self._completion(text, ids, tokens, finish, latency)
        return [c for c in out if c is not None]

    def _completion(self, prompt_text: str, prompt_ids: list[int], tokens: list[int], finish: str, latency: float) -> Completion:
        body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        reasoning, _ = split_thinking(text)
        if self.think_end_id is not None and self.think_end_id in body:
            thinking = body.index(self.think_end_id) + 1
        elif reasoning:  # a tokenizer without a </think> token: count the reasoning text
            thinking = len(self.tokenizer(reasoning, add_special_tokens=False)["input_ids"])
        else:
            thinking = 0
        return Completion(text=text, reasoning=reasoning, prompt_text=prompt_text, prompt_tokens=len(prompt_ids),
                          completion_tokens=len(tokens), thinking_tokens=thinking,
                          answer_tokens=max(len(tokens) - thinking, 0), latency_s=latency, finish_reason=finish)

    def _decode(self, prompts: list[list[int]], gen: GenerationSettings, seeds: list[int]) -> list[tuple[list[int], str]]:
        import torch
        from transformers import DynamicCache
        from transformers.generation.logits_process import (
            LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

        warpers = LogitsProcessorList()
        if not gen.greedy:
            warpers.append(TemperatureLogitsWarper(gen.temperature))
            if gen.top_k:
                warpers.append(TopKLogitsWarper(gen.top_k))
            if gen.top_p < 1.0:
                warpers.append(TopPLogitsWarper(gen.top_p))
            if gen.min_p > 0:
                warpers.append(MinPLogitsWarper(gen.min_p))
        generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        generated: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                logits_to_keep=1, **{self.cache_kw: cache}).logits[:, -1, :]
            for _ in range(gen.max_new_tokens):
                if gen.greedy:
                    nxt = logits.argmax(-1)
                else:
                    probs = torch.softmax(warpers(ids, logits.float()), dim=-1)
                    nxt = torch.stack([torch.multinomial(probs[r], 1, generator=generators[r])[0] for r in range(len(prompts))])
                for r, tok in enumerate(nxt.tolist()):
                    if not done[r]:
                        generated[r].append(tok)
                        done[r] = tok in self.eos_ids
                if all(done):
                    break
                mask = torch.cat([mask, mask.new_ones((len(prompts), 1))], dim=-1)
                positions = positions[:, -1:] + 1
                logits = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions,
                                    use_cache=True, **{self.cache_kw: cache}).logits[:, -1, :]
        return [(g, "stop" if d else "length") for g, d in zip(generated, done)]


def _gen_key(gen: GenerationSettings) -> tuple:
    return (gen.max_new_tokens, gen.temperature, gen.top_p, gen.top_k, gen.min_p)

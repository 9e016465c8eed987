"""Teacher-forced attention probe: prefill the prompt with the model's fast kernel into a KV cache,
then run the completion in chunks through the probe's attention function, which keeps only region
sums per layer and head, for thinking and answer tokens separately.

Memory: the KV cache plus chunk x seq scores for one layer at a time, never seq x seq.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from harness.engine.attention import attention_implementation
from harness.measure.attention import kernel

THINKING, ANSWER = 0, 1
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


@dataclass
class ProbeResult:
    masses: np.ndarray  # [2 (thinking, answer), layers, heads, regions]: sums over that phase's tokens
    counts: np.ndarray  # [2]: completion tokens per phase; masses[p].sum(-1) == counts[p]
    strip: np.ndarray  # [prompt tokens]: attention at strip_layer, mean over heads and completion tokens
    strip_layer: int
    rows: dict[int, np.ndarray] | None = None  # layer -> [heads, completion tokens, regions], when asked


def completion_phases(text: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Thinking or answer for each completion token, by the same rule as render.split_thinking:
    everything through `</think>` is thinking; a completion that opened `<think>` and never closed
    it is all thinking; otherwise all answer."""
    close = text.find(_THINK_CLOSE)
    if close >= 0:
        end = close + len(_THINK_CLOSE)
    else:
        end = len(text) if text.lstrip().startswith(_THINK_OPEN) else 0
    return [THINKING if s < end else ANSWER for s, _ in offsets]


class AttentionProbe:
    def __init__(self, model, chunk_size: int = 64, strip_layer: int = -1):
        self.model, self.chunk_size = model, chunk_size
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.layers, self.heads = cfg.num_hidden_layers, cfg.num_attention_heads
        if not -self.layers <= strip_layer < self.layers:
            raise ValueError(f"strip_layer {strip_layer} out of range for {self.layers} layers")
        self.strip_layer = strip_layer % self.layers
        # transformers 5.2x renamed forward's past_key_values to cache
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], prompt_regions: Sequence[int],
            phases: Sequence[int], n_regions: int, keep_rows: bool = False, prompt_kv=None) -> ProbeResult:
        """prompt_regions: region id per prompt token (< n_regions - 1); completion tokens are keys of
        the last region (generated). phases: THINKING/ANSWER per completion token. prompt_kv: the
        prompt's per-layer (keys, values) from the generation, replayed on instead of a prefill."""
        from transformers import DynamicCache

        p, n = len(prompt_ids), len(completion_ids)
        if len(prompt_regions) != p or len(phases) != n:
            raise ValueError("prompt_regions must match prompt_ids and phases completion_ids in length")
        if p == 0 or n == 0:
            raise ValueError("the probe needs a non-empty prompt and completion")
        device = self.model.device
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
        sink = kernel.Sink(
            key_region=torch.tensor(list(prompt_regions) + [n_regions - 1] * n, device=device),
            phase=torch.tensor([ANSWER] * p + list(phases), device=device), n_regions=n_regions,
            masses=torch.zeros(2, self.layers, self.heads, n_regions, dtype=torch.float64), prompt_len=p,
            strip_layer=self.strip_layer, strip=torch.zeros(p, dtype=torch.float64), keep_rows=keep_rows)
        if prompt_kv is not None and prompt_kv[0][0].shape[-2] != p:
            raise ValueError(f"prompt_kv covers {prompt_kv[0][0].shape[-2]} positions, the prompt {p}")
        # the cache appends by concatenation: the generation's tensors are read, never written
        cache = DynamicCache(ddp_cache_data=prompt_kv) if prompt_kv is not None else DynamicCache()
        with torch.inference_mode():
            if prompt_kv is None:
                self.model(input_ids=ids[:, :p], use_cache=True, logits_to_keep=1, **{self.cache_kw: cache})
            with attention_implementation(self.model, kernel.NAME):
                for start in range(p, p + n, self.chunk_size):
                    self.model(input_ids=ids[:, start:start + self.chunk_size], use_cache=True, logits_to_keep=1,
                               probe_sink=sink, **{self.cache_kw: cache})
        if sink.visits != set(range(self.layers)):
            raise RuntimeError(f"{type(self.model).__name__} does not route attention through transformers' "
                               "AttentionInterface in every layer; the attention probe cannot measure it")
        counts = np.bincount(np.asarray(phases), minlength=2)
        rows = {k: torch.cat(v, dim=1).numpy() for k, v in sink.rows.items()} if keep_rows else None
        return ProbeResult(masses=sink.masses.numpy().astype(np.float32), counts=counts,
                           strip=(sink.strip / (n * self.heads)).numpy().astype(np.float32),
                           strip_layer=self.strip_layer, rows=rows)


def reference_masses(model, prompt_ids: Sequence[int], completion_ids: Sequence[int], prompt_regions: Sequence[int],
                     phases: Sequence[int], n_regions: int) -> np.ndarray:
    """The naive way, for tests and the benchmark: one eager pass with output_attentions=True (every
    layer's full seq x seq matrix), then region sums of the completion rows. [2, layers, heads, regions]."""
    p = len(prompt_ids)
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=model.device)
    onehot = torch.nn.functional.one_hot(torch.tensor(list(prompt_regions) + [n_regions - 1] * len(completion_ids)),
                                         n_regions).double()
    phase = torch.tensor(list(phases))
    with torch.inference_mode(), attention_implementation(model, "eager"):
        attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    out = np.zeros((2, len(attentions), attentions[0].shape[1], n_regions))
    for layer, att in enumerate(attentions):
        region = att[0, :, p:].double().cpu() @ onehot  # [heads, completion, regions]
        for ph in (THINKING, ANSWER):
            out[ph, layer] = region[:, phase == ph].sum(1).numpy()
    return out

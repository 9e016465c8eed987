"""Every sample's attention arrays, as `<sample_id>/<name>` entries of compressed `.npz` parts.

Each batch writes one new part, `attention/part-<n>.npz` in the directory the batch's records go to
(the run or its shard), atomically: a killed run leaves only complete parts, and no batch rewrites
what earlier batches wrote (I/O stays linear in the run's length). A resumed run adds parts; a
sample measured again (a redone sample) is read from the newest part that holds it, across the run
and all its shards. numpy only: analysis reads it without torch.
"""
from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import numpy as np

from harness.io.files import atomic_path, own_dir
from harness.io.jsonl import open_regular
from harness.rundir.layout import ATTENTION_DIR, run_parts, run_root

_PART = re.compile(r"part-(\d+)\.npz")


def ref(part: Path, sample_id: str) -> str:
    """What a record's attention_ref holds: the part, relative to the run directory (a shard's part
    under `shards/...`), and the key."""
    return f"{part.as_posix()}#{sample_id}"


def _numbered(folder: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in folder.glob("part-*.npz") if (m := _PART.fullmatch(p.name)))


def parts(run_dir: Path) -> list[Path]:
    """The archives of the run and all its shards, oldest first (by write time, then number)."""
    found = [p for part_dir in run_parts(run_dir) for _, p in _numbered(Path(part_dir) / ATTENTION_DIR)]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def append(part_dir: Path, samples: dict[str, dict[str, np.ndarray]]) -> dict[str, str]:
    """Write the samples as the next part of `part_dir` (the run or its shard); sample_id -> its
    attention_ref, relative to the run directory."""
    if not samples:
        return {}
    folder = own_dir(Path(part_dir) / ATTENTION_DIR)  # a link there would put the parts wherever it points
    name = f"part-{max((n for n, _ in _numbered(folder)), default=-1) + 1:06d}.npz"
    with atomic_path(folder / name) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
            for sid, arrays in samples.items():
                for key, value in arrays.items():
                    buf = io.BytesIO()
                    np.lib.format.write_array(buf, np.asarray(value), allow_pickle=False)
                    out.writestr(f"{sid}/{key}.npy", buf.getvalue())
    rel = (folder / name).relative_to(run_root(part_dir))
    return {sid: ref(rel, sid) for sid in samples}


def _read(path: Path, only: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    with open_regular(path) as fh, np.load(fh, allow_pickle=False) as npz:  # a FIFO would block the reader
        for key in npz.files:
            sid, name = key.split("/", 1)
            if only is None or sid == only:
                out.setdefault(sid, {})[name] = npz[key]
    return out


def load(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """sample_id -> {name: array} over all parts of the run and its shards, a newer part's sample
    replacing an older one's; empty when the run has no probe."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for path in parts(run_dir):
        out.update(_read(path))
    return out


def load_ref(run_dir: Path, attention_ref: str) -> dict[str, np.ndarray]:
    """One record's arrays, from the part its attention_ref names (relative to the run directory).
    A reference is data: one leading outside the run directory (`/etc/passwd#x`, `../..`) is a
    ValueError, never opened."""
    part, sid = attention_ref.rsplit("#", 1)
    path = (Path(run_dir) / part).resolve()
    if not path.is_relative_to(Path(run_dir).resolve()):
        raise ValueError(f"not a file inside the run directory {run_dir}")
    arrays = _read(path, only=sid)
    if sid not in arrays:
        raise KeyError(f"{attention_ref}: no such sample in {Path(run_dir) / part}")
    return arrays[sid]

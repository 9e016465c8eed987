"""Every sample's attention arrays, as `<sample_id>/<name>` entries of compressed `.npz` parts.

Each batch writes one new part, `attention/part-<n>.npz`, to a temporary name and renames it into
place: a killed run leaves only complete parts, and no batch rewrites what earlier batches wrote
(I/O stays linear in the run's length). A resumed run adds parts; a sample measured again (a redone
sample) is read from the newest part that holds it. A run made before parts existed has one
`attention.npz`, which is read as the oldest part. numpy only: analysis reads it without torch.
"""
from __future__ import annotations

import io
import os
import re
import zipfile
from pathlib import Path

import numpy as np

DIRNAME = "attention"
LEGACY = "attention.npz"  # the single archive of runs made before parts
_PART = re.compile(r"part-(\d+)\.npz")


def ref(part: str, sample_id: str) -> str:
    """What a record's attention_ref holds: the part, relative to the run directory, and the key."""
    return f"{part}#{sample_id}"


def parts(run_dir: Path) -> list[Path]:
    """The run's archives, oldest first (the legacy single archive before every part)."""
    run_dir = Path(run_dir)
    found = sorted((int(m.group(1)), p) for p in (run_dir / DIRNAME).glob("part-*.npz")
                   if (m := _PART.fullmatch(p.name)))
    legacy = [run_dir / LEGACY] if (run_dir / LEGACY).is_file() else []
    return legacy + [p for _, p in found]


def append(run_dir: Path, samples: dict[str, dict[str, np.ndarray]]) -> dict[str, str]:
    """Write the samples as the run's next part; sample_id -> its attention_ref."""
    if not samples:
        return {}
    folder = Path(run_dir) / DIRNAME
    folder.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in folder.glob("part-*.npz") if (m := _PART.fullmatch(p.name))]
    name = f"part-{max(numbers, default=-1) + 1:06d}.npz"
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for sid, arrays in samples.items():
            for key, value in arrays.items():
                buf = io.BytesIO()
                np.lib.format.write_array(buf, np.asarray(value), allow_pickle=False)
                out.writestr(f"{sid}/{key}.npy", buf.getvalue())
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, folder / name)
    return {sid: ref(f"{DIRNAME}/{name}", sid) for sid in samples}


def _read(path: Path, only: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            sid, name = key.split("/", 1)
            if only is None or sid == only:
                out.setdefault(sid, {})[name] = npz[key]
    return out


def load(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """sample_id -> {name: array} over all parts, a newer part's sample replacing an older one's;
    empty when the run has no probe."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for path in parts(run_dir):
        out.update(_read(path))
    return out


def load_ref(run_dir: Path, attention_ref: str) -> dict[str, np.ndarray]:
    """One record's arrays, from the part its attention_ref names."""
    part, sid = attention_ref.rsplit("#", 1)
    arrays = _read(Path(run_dir) / part, only=sid)
    if sid not in arrays:
        raise KeyError(f"{attention_ref}: no such sample in {Path(run_dir) / part}")
    return arrays[sid]

"""One compressed `.npz` per run holding every sample's attention arrays as `<sample_id>/<name>`.

Each batch rewrites the archive into a temporary file and renames it over the old one, so a killed
run leaves the previous complete archive; a resumed run rewrites the entries of the samples it
redoes. numpy only: analysis reads it without torch.
"""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np

FILENAME = "attention.npz"


def ref(sample_id: str) -> str:
    """What a record's attention_ref holds: the archive, relative to the run directory, and the key."""
    return f"{FILENAME}#{sample_id}"


def append(run_dir: Path, samples: dict[str, dict[str, np.ndarray]]) -> None:
    if not samples:
        return
    path = Path(run_dir) / FILENAME
    tmp = path.with_name(f".{FILENAME}.tmp-{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
        if path.exists():
            with zipfile.ZipFile(path) as old:
                for info in old.infolist():
                    if info.filename.split("/", 1)[0] not in samples:
                        out.writestr(info, old.read(info))
        for sid, arrays in samples.items():
            for name, value in arrays.items():
                buf = io.BytesIO()
                np.lib.format.write_array(buf, np.asarray(value), allow_pickle=False)
                out.writestr(f"{sid}/{name}.npy", buf.getvalue())
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """sample_id -> {name: array}; empty when the run has no probe."""
    path = Path(run_dir) / FILENAME
    if not path.exists():
        return {}
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            sid, name = key.split("/", 1)
            out.setdefault(sid, {})[name] = npz[key]
    return out

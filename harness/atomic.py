"""One way to replace a file or folder atomically: write beside it under a temporary name, then rename.
A reader (or a resumed run) never sees a half-written manifest, attention part, converted model or
tokenizer, and a failed write leaves nothing behind."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def temporary_name(dest: Path) -> Path:
    """The hidden name a write to `dest` goes through, unique to this process."""
    return dest.with_name(f".{dest.name}.tmp-{os.getpid()}")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_path(dest: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside `dest` to write a file or a folder to; on success it is
    fsynced (a file) and renamed onto `dest`; on any error it is removed and the error raised."""
    dest = Path(dest)
    tmp = temporary_name(dest)
    _remove(tmp)  # left by an earlier process with the same pid
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise


def write_text(dest: Path | str, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")

"""Writing files so that a full disk (or a read-only one) loses nothing already written and leaves
no empty or half-written file behind: whole files are written beside their target and renamed
into place, and the failure is told in words, not as a raw OSError traceback."""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` to write; renamed over `path` on success, removed on failure
    (readers never see a partial file, a failed write leaves none)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        with suppress(OSError):  # on a read-only or vanished directory there is nothing to remove
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not exc.filename:  # name the file the user knows, not the temporary
            exc.filename = str(path)
        raise


def write_file(path: Path, data: str | bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def os_error_message(exc: OSError) -> str:
    """One line for a user: what could not be written and what to do."""
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"the disk is full{where}: everything written before is kept (no partial files); "
                "free some space and run the same command again to continue")
    if exc.errno == errno.EROFS:
        return f"read-only file system{where}: write the output elsewhere (run.root=..., or --out for reports)"
    return f"{exc.strerror or exc}{where}"

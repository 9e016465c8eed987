"""Writing files so that a crash, a full disk or a read-only one loses nothing already written and
leaves no empty or half-written file behind: a file or folder is written beside its target under a
temporary name and renamed into place, and a failure is told in words, not as an OSError traceback.
One helper for every such write: manifests, reports, figures, parquet caches, attention parts,
converted models and tokenizers. No write goes through a symbolic link: a file is renamed into place
(replacing a link, never writing to its target), and a file appended to or a folder written into is
refused when it is a link."""
from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

TMP_MARK = ".tmp-"  # temporary names end in .tmp-<pid>, so a dead process's leftovers can be found
# a link in a run directory may point anywhere (`.lock.pid -> ~/.bashrc`): no write goes through one
LINK = "a symbolic link: statusbench writes no file through a link (remove it and run again)"


def temporary_name(dest: Path) -> Path:
    """The hidden name a write to `dest` goes through, unique to this process."""
    return dest.with_name(f".{dest.name}{TMP_MARK}{os.getpid()}")


def remove_stale_temporaries(folder: Path | str) -> list[Path]:
    """Remove the temporary files and folders in `folder` whose writing process is gone (killed
    mid-write: kill -9, a full node); those of a live pid are kept. Returns what was removed."""
    import psutil

    removed = []
    for tmp in Path(folder).glob(f".*{TMP_MARK}*"):
        pid = tmp.name.rsplit(TMP_MARK, 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
            _remove(tmp)
            removed.append(tmp)
    return removed


def _remove(path: Path) -> None:
    with suppress(OSError):  # on a read-only or vanished directory there is nothing to remove
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


@contextmanager
def atomic_path(dest: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside `dest` to write a file or a folder to; on success it is fsynced
    (a file) and renamed onto `dest`; on any error it is removed and the error raised, naming `dest`."""
    dest = Path(dest)
    tmp = temporary_name(dest)
    _remove(tmp)  # left by an earlier process with the same pid
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError) and (not exc.filename or str(exc.filename) == str(tmp)):
            exc.filename = str(dest)  # the file the user knows, not the temporary
        raise


def write_file(dest: Path | str, data: str | bytes) -> None:
    """`dest` holds data, written beside it and renamed into place: a link at `dest` is replaced,
    never written through."""
    with atomic_path(dest) as tmp:
        with os.fdopen(open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def open_nofollow(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """os.open without following a symbolic link at `path`: one is an OSError saying so (LINK)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, LINK, str(path)) from None
        raise


def own_dir(path: Path | str) -> Path:
    """`path` created as a folder (parents too), or an OSError (LINK) when it is a symbolic link:
    the files written into it would land wherever the link points."""
    path = Path(path)
    if path.is_symlink():
        raise OSError(errno.ELOOP, LINK, str(path))
    path.mkdir(parents=True, exist_ok=True)
    return path


def os_error_message(exc: OSError) -> str:
    """One line for a user: what could not be written and what to do."""
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"the disk is full{where}: everything written before is kept (no partial files); "
                "free some space and run the same command again to continue")
    if exc.errno == errno.EROFS:
        return f"read-only file system{where}: write the output elsewhere (run.root=..., or --out for reports)"
    return f"{exc.strerror or exc}{where}"

"""A run directory: append-only records, deduplicated prompts, a manifest, and a writer lock.

records.jsonl gets one line per sample, flushed and fsynced after each batch, so a killed run loses
at most the batch in flight; a torn last line (killed mid-write) is cut off on the next open.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from filelock import FileLock, Timeout

from harness.io.files import LINK, open_nofollow, write_file
from harness.io.jsonl import open_regular, parse_row, read_regular, stream_lines
from harness.rundir.layout import ATTENTION_DIR, MANIFEST, PROMPTS, RECORDS, run_root
from harness.types import Message, Record, canonical_json, json_default, sha256

log = logging.getLogger(__name__)


class RunDirError(ValueError):
    """A run directory that cannot be written safely: in use, corrupt, or of another schema."""


class RunLockedError(RunDirError):
    pass


def prompt_hash(rendered: str | None, messages: list[Message], tools: list[dict]) -> str:
    return sha256(rendered if rendered is not None else canonical_json({"messages": messages, "tools": tools}))


def _append_lines(path: Path, lines: Iterable[str]) -> None:
    # backslashreplace: a lone surrogate from model output is written as its JSON escape and reads back intact
    _append_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8", errors="backslashreplace"))


def _append_bytes(path: Path, data: bytes) -> None:
    """All of data appended, or (a full disk) the file cut back to what it held before."""
    if not data:
        return
    # unbuffered: after a failed write no buffered tail is left for close() to flush past the cut;
    # a link in the records' place (to a file outside the run) is refused, never appended to
    with os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab", buffering=0) as fh:
        size = fh.tell()
        try:
            view = memoryview(data)
            while view:  # a raw write may take only part of the data
                view = view[fh.write(view):]
            os.fsync(fh.fileno())
        except OSError as exc:
            fh.truncate(size)
            exc.filename = exc.filename or str(path)
            raise


def read_jsonl(path: Path, *, repair: bool = False, required: tuple[str, ...] = (),
               check: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """All complete lines, each an object with the `required` fields that `check` accepts (else
    RunDirError naming the line; check raises ValueError naming the field). A torn final line is dropped with a warning (and cut off if repair); a complete object
    merely lacking its newline (a hand edit) is kept, and with repair given its newline. Read as a
    stream from a regular file only (anything else is a RunDirError naming it)."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    good_end, cut, newline = 0, False, False
    with open_regular(path, str(path), RunDirError) as fh:
        for n, line in enumerate(stream_lines(fh, str(path), RunDirError), 1):
            if not line.endswith(b"\n") and line.strip():  # the last line, without its newline
                try:
                    complete = isinstance(json.loads(line), dict)
                except (ValueError, RecursionError):
                    complete = False
                if not complete:
                    log.warning("%s: dropping a torn last line (%d bytes) left by an interrupted write", path, len(line))
                    cut = True
                    break
                newline = True
            good_end += len(line)
            row = parse_row(line, str(path), n, RunDirError, required)
            if row is None:
                continue
            if check:
                try:
                    check(row)
                except ValueError as exc:
                    raise RunDirError(f"{path} line {n}: {exc}") from None
            rows.append(row)
    if repair and newline:
        _append_bytes(path, b"\n")
    if repair and cut:
        fd = open_nofollow(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, good_end)
        finally:
            os.close(fd)
    return rows


# what a run writes by name beside its manifest (and Hydra's job log, *.log): a link at one of these
# names would have the write land wherever it points
WRITTEN = (RECORDS, PROMPTS, ".lock", ".hydra", ATTENTION_DIR)


def probe_lock(run_dir: Path) -> None:
    """RunLockedError if another process holds run_dir's writer lock (checked before Hydra writes
    `.hydra/` into it); RunDirError if a file or folder the run writes, in it or in the run it is a
    shard of, is a symbolic link. Nothing is created when the directory does not exist yet."""
    run_dir = Path(run_dir)
    for folder in dict.fromkeys([run_dir, run_root(run_dir)]):
        for path in [*(folder / name for name in WRITTEN), *folder.glob("*.log")]:
            if path.is_symlink():
                raise RunDirError(f"{path}: {LINK}")
    if (run_dir / ".lock").exists():
        lock = FileLock(str(run_dir / ".lock"))
        _acquire(lock, run_dir)
        lock.release()


def _acquire(lock: FileLock, run_dir: Path) -> None:
    try:
        lock.acquire(timeout=0)  # an flock: released by the kernel if the owner dies
    except Timeout:
        try:  # a FIFO or a huge file in its place would hang or fill memory: the pid is then unknown
            owner = read_regular(run_dir / ".lock.pid", error=OSError, limit=64).decode("ascii", "replace").strip()
        except OSError:
            owner = "?"
        raise RunLockedError(f"run directory {run_dir} is in use by another statusbench process (pid {owner})") from None
    except OSError as exc:  # filelock refuses a link in the lock's place (it would lock, or create, its target)
        raise RunDirError(f"{run_dir / '.lock'}: {LINK if exc.errno == errno.ELOOP else exc.strerror}") from None


def record_time(created_at: str | None) -> datetime:
    """When a record was made (its created_at); a record without one is older than any with one."""
    try:
        t = datetime.fromisoformat(created_at)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return datetime.min.replace(tzinfo=timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def newest(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """sample_id -> its newest record by time; on a tie the later row (rows in write order) wins."""
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        held = latest.get(row["sample_id"])
        if held is None or record_time(row.get("created_at")) >= record_time(held.get("created_at")):
            latest[row["sample_id"]] = row
    return latest


class RunStore:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.records_path = self.dir / RECORDS
        self.prompts_path = self.dir / PROMPTS
        self.manifest_path = self.dir / MANIFEST
        self._lock = FileLock(str(self.dir / ".lock"))
        self._prompts: set[str] = set()

    def __enter__(self) -> "RunStore":
        _acquire(self._lock, self.dir)
        for path in (self.records_path, self.prompts_path):  # appended to: refused now, not after a batch is generated
            if path.is_symlink():
                self._lock.release()
                raise RunDirError(f"{path}: {LINK}")
        write_file(self.dir / ".lock.pid", str(os.getpid()))  # renamed into place: a link there is replaced
        self._prompts = {row["prompt_sha256"] for row in read_jsonl(self.prompts_path, repair=True, required=("prompt_sha256",))}
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def append(self, records: list[Record], prompts: list[dict[str, Any]]) -> None:
        new_prompts = []
        for p in prompts:
            if p["prompt_sha256"] not in self._prompts:
                self._prompts.add(p["prompt_sha256"])
                new_prompts.append(canonical_json(p))
        # prompts first: a record never points at a prompt that is not on disk
        _append_lines(self.prompts_path, new_prompts)
        _append_lines(self.records_path, (canonical_json(asdict(r)) for r in records))

    def append_rows(self, name: str, rows: Iterable[dict[str, Any]]) -> None:
        """Rows of another JSONL file of the run (e.g. rollouts.jsonl), appended and fsynced like records."""
        _append_lines(self.dir / name, (canonical_json(r) for r in rows))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_file(self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True, default=json_default))

    def read_manifest(self) -> dict[str, Any]:
        if not os.path.lexists(self.manifest_path):
            return {}
        try:  # a FIFO in its place would block the run forever: only a regular file is read
            manifest = json.loads(read_regular(self.manifest_path, error=RunDirError))
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{self.manifest_path} line {exc.lineno} is not valid JSON ({exc.msg}); "
                              "restore it or move the run directory aside") from None
        except ValueError as exc:  # invalid UTF-8
            raise RunDirError(f"{self.manifest_path} is not readable JSON ({exc})") from None
        if not isinstance(manifest, dict):
            raise RunDirError(f"{self.manifest_path} must hold a JSON object")
        return manifest

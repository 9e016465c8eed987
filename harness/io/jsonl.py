"""JSON Lines parsing shared by run files, scripted completions and users' traces: a bad line is
reported with its file, number and problem, never parsed as garbage.

Lines end at "\\n" only: records are written with `ensure_ascii=False`, so model output may hold
U+2028, U+2029 or U+0085 raw, and `str.splitlines()` would cut a record in two at them. Every row
must be a JSON object; NaN/Infinity (Python's JSON extensions), nesting too deep for the parser and
integers beyond Python's digit limit are refused with the line named. A lone surrogate escape
(`"\\ud83d"`, valid JSON but no character) is read as U+FFFD (harness.io.text), so a line that
parses can always be written and read again.

Files are read line by line from regular files only: a FIFO would block the reader forever and
/dev/zero or a huge sparse file would fill memory, so anything else is refused naming the path, and a
line longer than MAX_LINE_BYTES is refused naming its number.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from harness.io.text import map_strings, whole_chars

MAX_LINE_BYTES = 64 * 2**20  # far above any record or prompt (a 200 KB tool output is 0.2 MiB)
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}

# the only way JSON text carries a surrogate: an escape \ud800-\udfff (checked before walking a row)
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_line(line: str | bytes, where: str, n: int, error: type[Exception] = ValueError) -> Any:
    """One JSON value, or `error("{where} line {n} ...")`."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where} line {n} is not valid UTF-8 (byte {exc.start + 1})") from None
    try:
        value = json.loads(line, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{where} line {n} is not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise error(f"{where} line {n} is nested too deeply to read") from None
    except ValueError as exc:  # NaN/Infinity, or an integer past sys.get_int_max_str_digits()
        raise error(f"{where} line {n} is not valid JSON ({str(exc).split(';')[0]})") from None
    return map_strings(value, whole_chars) if SURROGATE_ESCAPE.search(line) else value


def parse_row(line: str | bytes, where: str, n: int, error: type[Exception] = ValueError,
              required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The object on a line (None for a blank one); `error(f"{where} line N ...")` when it is not
    JSON, not an object, or lacks one of `required`."""
    if not line.strip():
        return None
    row = parse_line(line, where, n, error)
    if not isinstance(row, dict):
        raise error(f"{where} line {n} must be a JSON object, got {type(row).__name__ if row is not None else 'null'}")
    missing = [k for k in required if k not in row]
    if missing:
        raise error(f"{where} line {n} lacks field {missing[0]!r}")
    return row


def iter_lines(data: str | bytes | Iterable[str | bytes], where: str, error: type[Exception] = ValueError,
               required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a text or of its lines; `error(...)` on the
    first bad one (see parse_row)."""
    lines = data.split(b"\n" if isinstance(data, bytes) else "\n") if isinstance(data, (str, bytes)) else data
    for n, line in enumerate(lines, 1):
        row = parse_row(line, where, n, error, required)
        if row is not None:
            yield n, row


@contextmanager
def open_regular(path: str | Path, where: str | None = None, error: type[Exception] = ValueError) -> Iterator[IO[bytes]]:
    """The file opened for reading in binary, or `error("{where} is not a regular file (a FIFO)")`.
    Opened non-blocking, so that a FIFO without a writer is refused instead of waited on."""
    path = Path(path).expanduser()
    where = where or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise error(f"{where}: {exc.strerror}") from None
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        raise error(f"{where} is not a regular file ({_KINDS.get(kind, 'not a file')})")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as fh:
        yield fh


def read_regular(path: str | Path, where: str | None = None, error: type[Exception] = ValueError,
                 limit: int = MAX_LINE_BYTES) -> bytes:
    """The whole of a regular file (see open_regular), or `error` naming it when it is something
    else or larger than `limit` bytes (a manifest, a pid file: small files read at once)."""
    where = where or str(Path(path).expanduser())
    with open_regular(path, where, error) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{where} is larger than {limit} bytes: not a file statusbench wrote")
    return data


def file_sha256(path: str | Path, where: str | None = None, error: type[Exception] = ValueError) -> str:
    """SHA-256 of a regular file (see open_regular), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open_regular(path, where, error) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stream_lines(fh: IO[bytes], where: str, error: type[Exception] = ValueError) -> Iterator[bytes]:
    """A binary file's lines, each with its "\\n" (the last may lack it), one at a time; `error` on a
    line over MAX_LINE_BYTES, so memory holds one line at most."""
    for n, line in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), 1):
        if len(line) > MAX_LINE_BYTES:
            raise error(f"{where} line {n} is longer than {MAX_LINE_BYTES >> 20} MiB: not a JSON Lines file")
        yield line


def read_lines(path: str | Path, where: str | None = None, error: type[Exception] = ValueError,
               required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """iter_lines over a regular file, streamed as bytes (so invalid UTF-8 is reported with its line)."""
    where = where or str(Path(path).expanduser())
    with open_regular(path, where, error) as fh:
        yield from iter_lines(stream_lines(fh, where, error), where, error, required)

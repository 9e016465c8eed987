"""JSON Lines parsing shared by run files, scripted completions and users' traces: a bad line is
reported with its file, number and problem, never parsed as garbage.

Lines end at "\\n" only: records are written with `ensure_ascii=False`, so model output may hold
U+2028, U+2029 or U+0085 raw, and `str.splitlines()` would cut a record in two at them. Every row
must be a JSON object; NaN/Infinity (Python's JSON extensions), nesting too deep for the parser and
integers beyond Python's digit limit are refused with the line named. A lone surrogate escape
(`"\\ud83d"`, valid JSON but no character) is read as U+FFFD (harness.io.text), so a line that
parses can always be written and read again.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from harness.io.text import map_strings, whole_chars

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


def iter_lines(data: str | bytes, where: str, error: type[Exception] = ValueError,
               required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; `error(f"{where} line N ...")` on the first
    bad one: not JSON, not an object, or lacking one of `required`."""
    for n, line in enumerate(data.split(b"\n" if isinstance(data, bytes) else "\n"), 1):
        if not line.strip():
            continue
        row = parse_line(line, where, n, error)
        if not isinstance(row, dict):
            raise error(f"{where} line {n} must be a JSON object, got {type(row).__name__ if row is not None else 'null'}")
        missing = [k for k in required if k not in row]
        if missing:
            raise error(f"{where} line {n} lacks field {missing[0]!r}")
        yield n, row


def read_lines(path: str | Path, where: str | None = None, error: type[Exception] = ValueError,
               required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """iter_lines over a file's bytes (so invalid UTF-8 is reported with its line)."""
    path = Path(path).expanduser()
    return iter_lines(path.read_bytes(), where or str(path), error, required)

"""JSON Lines parsing shared by run files, scripted completions and users' traces: a bad line is
reported with its number, never parsed as garbage."""
from __future__ import annotations

import json
from typing import Any, Iterator


def iter_lines(text: str, where: str, error: type[Exception] = ValueError) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-blank line; `error(f"{where} line N ...")` on the first bad one."""
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{where} line {n} is not valid JSON ({exc.msg})") from None

"""The one schema of a run's records, read typed: `Record` (records.jsonl, one per model call) and
`RolloutRecord` (rollouts.jsonl, one per rollout), as harness.types defines them.

Every row is checked against its dataclass's field types before anything counts it (the run's
resume and the analysis read through here): `"correct": "false"`, `"step": "1"`, a latency of
1e400 or a label that is a number stop the read with the file, line and field named, never a
traceback later. Records of schema 1 are upgraded as they are read: a single decision's record
becomes step 0 of its one-step rollout; a rollout step of schema 1 keeps its API-style calls as
`completion_tool_calls` (its parsed calls were not stored).
"""
from __future__ import annotations

import dataclasses
import sys
import types
import typing
from dataclasses import MISSING, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from harness.io.validate import of_type
from harness.rundir.store import read_jsonl
from harness.types import RECORD_SCHEMA_VERSION, Record, RolloutRecord

# what a record must hold to be counted at all (the rest may be absent or null in a hand-made file)
REQUIRED = ("sample_id", "episode_id", "condition", "model", "replicate", "label", "correct", "expected")
ROLLOUT_REQUIRED = ("rollout_id", "episode_id", "condition", "outcome", "steps", "violations")
READABLE_VERSIONS = (1, RECORD_SCHEMA_VERSION)


@dataclass(frozen=True)
class Column:
    name: str
    kind: type  # str, bool, int, float (a number that may be unknown), dict or list
    nullable: bool


@cache
def columns(schema: type) -> tuple[Column, ...]:
    """The schema's fields as (name, kind, nullable), read from its type annotations: `int | None` is a
    nullable int, `dict[str, Any]` a dict."""
    hints = typing.get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kinds = [typing.get_origin(a) or a for a in args if a is not type(None)]
        out.append(Column(f.name, kinds[0], len(kinds) < len(args)))
    return tuple(out)


_TYPES = {str: (str,), bool: (bool,), int: (int,), float: (int, float), dict: (dict,), list: (list,)}


def check_row(row: dict[str, Any], schema: type, required: tuple[str, ...]) -> None:
    """Each field present (or required) of its type: text, true/false, an integer, or a finite number
    >= 0 (counts, latencies, costs, steps); ValueError naming the field. Absent or null is allowed
    except for `required`."""
    for col in columns(schema):
        value = of_type(row, col.name, _TYPES[col.kind], optional=col.name not in required)
        if value is None or col.kind not in (int, float):
            continue
        if col.kind is float and not 0 <= value <= sys.float_info.max:  # NaN, inf and ints past a float's range fail
            raise ValueError(f"field {col.name!r} must be a finite number >= 0, got {str(value)[:40]}")
        if col.kind is int and not 0 <= value < 2**63:
            raise ValueError(f"field {col.name!r} must be an integer from 0 to 2**63 - 1, got {str(value)[:40]}")


def upgrade(row: dict[str, Any]) -> dict[str, Any]:
    """A record of schema 1 as schema 2 reads it; a record of schema 2 as it is."""
    if row.get("schema_version") != 1:
        return row
    if "rollout_id" not in row:  # a single decision: step 0 of its one-step rollout
        return {"turn": 0, "step": 0, "step_in_turn": 0, "completion_tool_calls": [], "calls": [], **row,
                "rollout_id": row.get("sample_id")}
    label, expected = row.get("label"), row.get("expected")
    return {**row, "completion_tool_calls": row.get("tool_calls") or [], "tool_calls": [],
            "correct": label == expected if isinstance(label, str) and isinstance(expected, str) else None,
            "params": row.get("params") or {}, "condition_config": row.get("condition_config") or {}}


def _check_version(row: dict[str, Any]) -> None:
    if row.get("schema_version") not in READABLE_VERSIONS:
        raise ValueError(f"schema version {row.get('schema_version')!r}: this statusbench reads versions "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")


def _check_record(row: dict[str, Any]) -> None:
    _check_version(row)
    check_row(upgrade(row), Record, REQUIRED)


def _check_rollout(row: dict[str, Any]) -> None:
    _check_version(row)
    check_row(row, RolloutRecord, ROLLOUT_REQUIRED)


def read_record_rows(path: Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """records.jsonl as checked rows of schema 2 (RunDirError naming the file, line and field)."""
    # the schema's required fields are checked after the upgrade (a step of schema 1 has no `correct`)
    return [upgrade(row) for row in read_jsonl(path, repair=repair, required=("sample_id",), check=_check_record)]


def read_rollout_rows(path: Path, *, repair: bool = False) -> list[dict[str, Any]]:
    return read_jsonl(path, repair=repair, required=ROLLOUT_REQUIRED, check=_check_rollout)


def _defaults(schema: type) -> dict[str, Any]:
    return {f.name: None if f.default is MISSING and f.default_factory is MISSING
            else f.default if f.default is not MISSING else f.default_factory() for f in dataclasses.fields(schema)}


def as_record(row: dict[str, Any]) -> Record:
    """A checked row as a Record; a field a hand-made file left out is null."""
    return Record(**{**_defaults(Record), **{k: v for k, v in row.items() if k in Record.__dataclass_fields__}})

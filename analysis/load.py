"""Records of one or many run directories as typed pandas DataFrames: one row per model call
(`load_records`: records.jsonl, the step records of every run, a single decision being step 0 of its
one-step rollout) and one per rollout (`load_rollouts`: rollouts.jsonl).

The columns come from the one schema (harness.types.Record, RolloutRecord; harness.rundir.records
reads and checks every row against it: `"correct": "false"`, `"step": "1"`, a latency of 1e400 or a
count that is text stop the load with the file, line and field named). Each run's records.jsonl is
parsed once into `records.parquet` beside it; the cache remembers the JSONL's SHA-256 and is rebuilt
when the JSONL changed in any way (a resumed run, a line edited in place to the same size) or the
loader's schema changed. Nested fields are flattened (`params.calls_made`, `generation.temperature`,
`condition_config.kind`).
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pandas as pd

from harness.io.files import atomic_path, remove_stale_temporaries
from harness.io.jsonl import file_sha256
from harness.rundir.layout import PROMPTS, ROLLOUTS, find_runs, run_parts
from harness.rundir.records import columns, read_record_rows, read_rollout_rows
from harness.rundir.store import RunDirError, read_jsonl
from harness.types import Record, RolloutRecord

log = logging.getLogger(__name__)

# bump when the columns or dtypes below change, so old caches are rebuilt
CACHE_VERSION = "5"
CACHE_NAME = "records.parquet"

# outcome labels in the order figures and tables show them
LABELS = ["violated", "complied", "refused", "other", "truncated", "error"]

# a schema field's kind -> its column's dtype; numbers that may be absent are float (NaN = not reported)
_DTYPES = {str: "str", bool: "bool", int: "int64", float: "float64"}


def schema_columns(schema: type) -> dict[str, str]:
    """column -> dtype of a record schema's scalar fields (a nullable int is a float: NaN is unknown);
    lists are kept as JSON text, dicts flattened to dotted columns."""
    out = {}
    for col in columns(schema):
        if col.kind is list:
            out[col.name] = "str"
        elif col.kind is not dict:
            out[col.name] = "float64" if col.kind is int and col.nullable else _DTYPES[col.kind]
    return out


COLUMNS = schema_columns(Record)
ROLLOUT_COLUMNS = schema_columns(RolloutRecord)
LISTS = [c.name for c in columns(Record) if c.kind is list]


def _parse(rows: list[dict], schema: dict[str, str] = COLUMNS) -> pd.DataFrame:
    for r in rows:  # a list of dicts does not fit one parquet column type; keep it as JSON text
        for col in LISTS:
            if col in schema:
                r[col] = json.dumps(r.get(col) or [], sort_keys=True)
    df = pd.DataFrame([_flatten(r) for r in rows])
    for col, dtype in schema.items():
        if col not in df:
            df[col] = pd.Series([None] * len(df), dtype="object")
        if dtype == "str":
            df[col] = df[col].astype("object").where(df[col].notna(), None).astype("string")
        elif dtype == "bool":
            df[col] = df[col].fillna(False).astype(bool)
        else:
            df[col] = pd.to_numeric(df[col]).astype(dtype)
    for col in df.columns.difference(list(schema)):
        # fields outside the schema (scenario parameters, fields added later) may mix types across
        # records or hold lists; as text they always fit one parquet column
        if df[col].dtype == object:
            df[col] = df[col].map(_as_text).astype("string")
    return df


def _flatten(row: dict) -> dict:
    """One level of nesting as dotted columns (`params.calls_made`); pd.json_normalize does the
    same but deep-copies every record, which made loading 100k records ~10x slower."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict) and value:
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _as_text(value: object) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def load_run(run_dir: Path | str, *, cache: bool = True) -> pd.DataFrame:
    """One run's records (typed), from the parquet cache when it is current."""
    d = Path(run_dir)
    path = d / "records.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{d} has no records.jsonl: is it a statusbench run directory?")
    digest = file_sha256(path, error=RunDirError)  # content, not size: an in-place edit keeps the size
    cached = d / CACHE_NAME
    if cache:
        remove_stale_temporaries(d)  # a cache half-written by a killed report
    if cache and cached.is_file():  # a FIFO or folder in its place is no cache: replaced
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            meta = pq.read_schema(cached).metadata or {}
            if meta.get(b"statusbench_jsonl_sha256") == digest.encode() and meta.get(b"statusbench_cache") == CACHE_VERSION.encode():
                return pd.read_parquet(cached)
        except (OSError, pa.ArrowException) as exc:
            log.warning("%s is unreadable (%s); it is only a cache of records.jsonl: rebuilding it", cached, exc)
    df = _parse(read_record_rows(path))  # a bad line is named
    if cache and not df.empty:
        _write_cache(df, cached, digest)
    return df


def _write_cache(df: pd.DataFrame, path: Path, jsonl_sha256: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
        meta = {**(table.schema.metadata or {}), b"statusbench_jsonl_sha256": jsonl_sha256.encode(),
                b"statusbench_cache": CACHE_VERSION.encode()}
        with atomic_path(path) as tmp:  # readers never see a half-written cache
            pq.write_table(table.replace_schema_metadata(meta), tmp)
    except (OSError, pa.ArrowException) as exc:  # e.g. a read-only or full disk: load without the cache
        log.warning("could not write the parquet cache %s: %s", path, exc)


def run_labels(run_dirs: list[Path]) -> dict[str, str]:
    """Short, unique names for runs: the directory name, or more of the path when names collide."""
    paths = [Path(d).resolve() for d in run_dirs]
    for depth in range(1, max(len(p.parts) for p in paths) + 1):
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(set(paths)):
            return {str(d): lab for d, lab in zip(run_dirs, labels)}
    return {str(d): str(d) for d in run_dirs}


def load_records(run_dirs: list[Path | str], *, cache: bool = True) -> pd.DataFrame:
    """Records of every run, with `run` (the directory as given) and `run_label` (a short unique name)."""
    dirs = [Path(d) for d in run_dirs]
    labels = run_labels(dirs)
    frames = []
    for d in dirs:
        parts = [load_run(p, cache=cache) for p in run_parts(d)]  # the run and its shards
        df = newest(pd.concat(parts, ignore_index=True))
        if not df.empty:
            frames.append(df.assign(run=str(d), run_label=labels[str(d)]))
    if not frames:
        return pd.DataFrame(columns=[*COLUMNS, "run", "run_label"])
    return pd.concat(frames, ignore_index=True)


def newest(df: pd.DataFrame, key: str = "sample_id") -> pd.DataFrame:
    """One row per `key`: the newest by created_at (a step run again with run.retry_errors, a rollout
    recorded again after it ran on, in the run or in any shard), a tie to the later row; rows keep their order."""
    made = pd.to_datetime(df["created_at"], utc=True, format="ISO8601", errors="coerce")
    made = made.fillna(pd.Timestamp.min.tz_localize("UTC"))
    keep = made.sort_values(kind="stable").index.to_series().groupby(df[key]).last()
    return df.loc[sorted(keep)].reset_index(drop=True)


def load_rollouts(run_dirs: list[Path | str]) -> pd.DataFrame:
    """One row per rollout of every run (the newest line of each), typed, with `run` and `run_label`."""
    dirs = [Path(d) for d in run_dirs]
    labels = run_labels(dirs)
    frames = []
    for d in dirs:
        rows = [row for part in run_parts(d) for row in read_rollout_rows(part / ROLLOUTS)]
        if rows:
            frames.append(newest(_parse(rows, ROLLOUT_COLUMNS), "rollout_id").assign(run=str(d), run_label=labels[str(d)]))
    if not frames:
        return pd.DataFrame(columns=[*ROLLOUT_COLUMNS, "run", "run_label"])
    return pd.concat(frames, ignore_index=True)


def prompt_rows(run_dirs: list[Path | str]) -> dict[str, dict]:
    """prompt_sha256 -> its prompts.jsonl row, over every run and shard."""
    return {row["prompt_sha256"]: row for d in run_dirs for part in run_parts(Path(d))
            for row in read_jsonl(part / PROMPTS, required=("prompt_sha256",))}


def runs_from_env(default_root: Path | str) -> list[Path]:
    """The runs named by STATUSBENCH_RUNS (separated by os.pathsep), else every run under default_root."""
    named = [Path(p) for p in os.environ.get("STATUSBENCH_RUNS", "").split(os.pathsep) if p]
    return named or find_runs(default_root)


def grid_columns(df: pd.DataFrame) -> list[str]:
    """Scenario parameters that vary across the records (the cells of the grid), minus the index."""
    cols = [c for c in df.columns if c.startswith("params.") and c != "params.index"]
    return [c for c in cols if df[c].astype(str).nunique() > 1]

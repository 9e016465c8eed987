"""Records of one or many run directories as one typed pandas DataFrame.

Each run's records.jsonl is parsed once into `records.parquet` beside it; the cache remembers the
JSONL's SHA-256 and is rebuilt when the JSONL changed in any way (a resumed run, a line edited in
place to the same size) or the loader's schema changed.
Nested fields are flattened (`params.calls_made`, `generation.temperature`, `condition_config.kind`).
Every record is typed as its columns before it is counted (`check_record`): `"correct": "false"`, a
latency of 1e400 (infinity) or a count that is text stop the load with the file, line and field named.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

import pandas as pd

from harness.io.files import atomic_path, remove_stale_temporaries
from harness.io.jsonl import file_sha256
from harness.io.validate import of_type
from harness.rundir.layout import find_runs, is_rollout_run, run_parts
from harness.rundir.store import RunDirError, read_jsonl

log = logging.getLogger(__name__)

# bump when the columns or dtypes below change, so old caches are rebuilt
CACHE_VERSION = "3"
CACHE_NAME = "records.parquet"

# outcome labels in the order figures and tables show them
LABELS = ["violated", "complied", "refused", "other", "truncated", "error"]

# column -> dtype; a record lacking an optional field (e.g. cost_usd) gets a missing value.
# Numbers that may be absent are float (NaN = not reported by the backend).
COLUMNS: dict[str, str] = {
    "sample_id": "str", "episode_id": "str", "scenario": "str", "family": "str", "condition": "str",
    "model": "str", "model_path": "str", "backend": "str", "replicate": "int64", "seed": "int64",
    "prompt_sha256": "str", "prompt_tokens": "float64", "cached_prompt_tokens": "float64",
    "completion_tokens": "float64", "thinking_tokens": "float64", "answer_tokens": "float64",
    "text": "str", "reasoning": "str", "tool_calls": "str", "label": "str", "correct": "bool",
    "expected": "str", "latency_s": "float64", "batch_latency_s": "float64", "cost_usd": "float64", "finish_reason": "str", "error": "str",
    "scripted": "bool", "created_at": "str", "schema_version": "int64", "token_source": "str",
    "reason": "str", "call_format": "str",
}
REQUIRED = ("sample_id", "episode_id", "condition", "model", "replicate", "label", "correct", "expected")
TYPES = {"str": (str,), "bool": (bool,), "int64": (int,), "float64": (int, float)}


def check_record(row: dict) -> None:
    """Each column of a record (present, or required) of its type: text, true/false, an integer, or
    a finite number >= 0 (token counts, latency, cost); ValueError naming the field. pandas would
    otherwise count the text "false" as correct and carry infinity into every mean."""
    for col, dtype in COLUMNS.items():
        value = of_type(row, col, (list,) if col == "tool_calls" else TYPES[dtype], optional=col not in REQUIRED)
        if value is None:
            continue
        if dtype == "float64" and not 0 <= value <= sys.float_info.max:  # NaN, inf and ints past a float's range fail
            raise ValueError(f"field {col!r} must be a finite number >= 0, got {str(value)[:40]}")
        if dtype == "int64" and not -2**63 <= value < 2**63:
            raise ValueError(f"field {col!r} must be a 64-bit integer, got {str(value)[:40]}")


def _parse(rows: list[dict]) -> pd.DataFrame:
    for r in rows:  # a list of dicts does not fit one parquet column type; keep it as JSON text
        r["tool_calls"] = json.dumps(r.get("tool_calls") or [], sort_keys=True)
    df = pd.DataFrame([_flatten(r) for r in rows])
    for col, dtype in COLUMNS.items():
        if col not in df:
            df[col] = pd.Series([None] * len(df), dtype="object")
        if dtype == "str":
            df[col] = df[col].astype("object").where(df[col].notna(), None).astype("string")
        elif dtype == "bool":
            df[col] = df[col].fillna(False).astype(bool)
        else:
            df[col] = pd.to_numeric(df[col]).astype(dtype)
    for col in df.columns.difference(list(COLUMNS)):
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
    if is_rollout_run(d):
        raise ValueError(f"{d} is a rollout run (experiment.mode=rollouts): its report is "
                         f"`python -m analysis.rollouts {d}`")
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
    df = _parse(read_jsonl(path, required=REQUIRED, check=check_record))  # a bad line is named
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


def newest(df: pd.DataFrame) -> pd.DataFrame:
    """One record per sample: the newest by created_at (a sample run again with run.retry_errors, in the
    run or in any shard), a tie to the later row; rows keep their order."""
    made = pd.to_datetime(df["created_at"], utc=True, format="ISO8601", errors="coerce")
    made = made.fillna(pd.Timestamp.min.tz_localize("UTC"))
    keep = made.sort_values(kind="stable").index.to_series().groupby(df["sample_id"]).last()
    return df.loc[sorted(keep)].reset_index(drop=True)


def runs_from_env(default_root: Path | str) -> list[Path]:
    """The runs named by STATUSBENCH_RUNS (separated by os.pathsep), else every run under default_root."""
    named = [Path(p) for p in os.environ.get("STATUSBENCH_RUNS", "").split(os.pathsep) if p]
    return named or find_runs(default_root)


def grid_columns(df: pd.DataFrame) -> list[str]:
    """Scenario parameters that vary across the records (the cells of the grid), minus the index."""
    cols = [c for c in df.columns if c.startswith("params.") and c != "params.index"]
    return [c for c in cols if df[c].astype(str).nunique() > 1]

"""Where a run's files live. One run directory holds one experiment; a sharded run splits into
`<run>/shards/<i>-of-<n>/`, each shard a directory of the same layout with its own records,
prompts, manifest, writer lock and attention parts. The runner writes through this layout, and
analysis and the attention report read through it, so a shard's files are never missed."""
from __future__ import annotations

from pathlib import Path

SHARDS_DIR = "shards"
RECORDS = "records.jsonl"
PROMPTS = "prompts.jsonl"
MANIFEST = "manifest.json"
ROLLOUTS = "rollouts.jsonl"  # experiment.mode=rollouts: one line per finished rollout
ATTENTION_DIR = "attention"


def shard_dir(run_dir: Path, shard: tuple[int, int] | None) -> Path:
    """Where a job writes: the run directory itself, or its shard's subdirectory."""
    return Path(run_dir) if shard is None else Path(run_dir) / SHARDS_DIR / f"{shard[0]}-of-{shard[1]}"


def run_parts(run_dir: Path) -> list[Path]:
    """The directories holding a run's records: the run itself and/or each of its shards."""
    run_dir = Path(run_dir)
    shards = sorted(p.parent for p in run_dir.glob(f"{SHARDS_DIR}/*/{RECORDS}"))
    return [run_dir] + shards if (run_dir / RECORDS).exists() or not shards else shards


def run_root(part_dir: Path) -> Path:
    """The run directory a part (the run itself or one of its shards) belongs to."""
    part_dir = Path(part_dir)
    return part_dir.parent.parent if part_dir.parent.name == SHARDS_DIR else part_dir


def find_runs(root: Path | str) -> list[Path]:
    """Run directories under root: those holding records, a sharded run counted once."""
    return sorted({run_root(p.parent) for p in Path(root).glob(f"**/{RECORDS}")})

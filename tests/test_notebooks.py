"""Every notebook under notebooks/ runs top to bottom on a small scripted run and rebuilds its figures."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from analysis.figures import FIGURES
from tests.conftest import REPO
from tests.test_regress import scripted_run

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    grid = ["scenario.calls_made=[2,3]", "scenario.placement=[early]", "scenario.episodes_per_cell=3"]
    usage = lambda s, i: {"usage": {"prompt_tokens": 300 + 40 * i, "completion_tokens": 20, "thinking_tokens": 0,  # noqa: E731
                                    "answer_tokens": 20}}  # token counts, so every figure has something to draw
    return scripted_run(tmp_path_factory.mktemp("notebooks"), "small", lambda c, i: i == 0, grid, usage)


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"figures.py", "paired_statistics.py"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, small_run: Path, tmp_path: Path, monkeypatch):
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(path)
    assert nb.metadata["jupytext"]["text_representation"]["format_name"] == "percent"
    out = tmp_path / "figures"
    # the kernel inherits this environment: the run to read, where figures go, and the source tree
    monkeypatch.setenv("STATUSBENCH_RUNS", str(small_run))
    monkeypatch.setenv("STATUSBENCH_FIGURES", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    if path.name == "figures.py":
        for name in FIGURES:
            assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").exists(), name
        shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
        assert len(shown) == len(FIGURES)  # each figure cell displays its figure

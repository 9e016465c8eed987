"""Analysis at scale for `harness.tools.bench`: `analysis.report` and `analysis.regress` over synthetic
runs of n records (a real run's records cycled, each cycle a new set of episodes), each command in a
child process of its own: its wall time and its peak RSS (the child's own, from wait4), and how both
grow between sizes (time ratio / size ratio: 1 is linear, 10 at a tenfold size would be quadratic)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.rundir.layout import PROMPTS, RECORDS
from harness.types import canonical_json

SIZES = (20_000, 200_000)


def synthetic_run(template: list[dict], prompts: Path, directory: Path, n: int) -> Path:
    """A run directory of n records cycled from `template`: cycle k's episodes are `<id>-k`, so every
    record pairs with exactly one of another synthetic run of the same size (regress pairs by episode)."""
    directory.mkdir(parents=True)
    with open(directory / RECORDS, "w", encoding="utf-8") as fh:
        for k in range(n):
            row = template[k % len(template)]
            cycle = k // len(template)
            fh.write(canonical_json({**row, "sample_id": f"synthetic-{k}", "episode_id": f"{row['episode_id']}-{cycle}"}) + "\n")
    shutil.copy(prompts, directory / PROMPTS)
    return directory


def measured(argv: list[str]) -> dict[str, Any]:
    """Run `python -m ARGV` as a child; its wall seconds, peak RSS (MB) and exit status."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "exit": proc.returncode, "stderr_tail": err[-500:]}


def analysis_scale(template: list[dict], prompts: Path, workdir: Path, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """report (one run) and regress (two runs of the same episodes) at each size, and their growth."""
    out: dict[str, Any] = {"sizes": list(sizes)}
    for n in sizes:
        base = synthetic_run(template, prompts, workdir / f"base-{n}", n)
        cand = synthetic_run(template, prompts, workdir / f"cand-{n}", n)
        out[str(n)] = {"jsonl_mb": (base / RECORDS).stat().st_size / 1e6,
                       "report": measured(["analysis.report", str(base), "--out", str(workdir / f"report-{n}")]),
                       "regress": measured(["analysis.regress", str(base), str(cand)])}
        shutil.rmtree(base)
        shutil.rmtree(cand)
    small, large = (out[str(n)] for n in (sizes[0], sizes[-1]))
    factor = sizes[-1] / sizes[0]
    out["growth"] = {cmd: {"time": large[cmd]["wall_s"] / small[cmd]["wall_s"] / factor,
                           "memory": large[cmd]["peak_rss_mb"] / small[cmd]["peak_rss_mb"]}
                     for cmd in ("report", "regress")}
    return out


def rows(scale: dict[str, Any]) -> list[list[Any]]:
    """Table rows for the bench's table: per command and size, seconds and peak RSS; then the growth."""
    out = []
    for cmd in ("report", "regress"):
        cells = [f"{scale[str(n)][cmd]['wall_s']:.1f} s, {scale[str(n)][cmd]['peak_rss_mb']:.0f} MB"
                 + ("" if scale[str(n)][cmd]["exit"] in (0, 1) else f" (exit {scale[str(n)][cmd]['exit']})")
                 for n in scale["sizes"]]
        g = scale["growth"][cmd]
        out.append([f"analysis.{cmd}: {' / '.join(f'{n:,}' for n in scale['sizes'])} records", " / ".join(cells), "",
                    f"time per record x{g['time']:.2f}, peak RSS x{g['memory']:.1f}"])
    return out

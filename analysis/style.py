"""One paper style for every figure: Okabe-Ito colours (safe for the common colour-vision deficiencies),
small serif-free type sized for a two-column paper, PNG for screens and PDF (embedded TrueType) for papers."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from harness.io.files import atomic_path

# Okabe & Ito (2008), "Color Universal Design"; black last so it is free for errors
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#F0E442", "#000000"]
LABEL_COLORS = {"violated": "#D55E00", "complied": "#009E73", "refused": "#0072B2", "other": "#E69F00",
                "truncated": "#CC79A7", "error": "#000000"}

REGION_ORDER = ["template", "system", "summary", "request", "call_records", "other_call", "distractor", "assistant",
                "question", "turn_meta", "diagnostics", "envelope", "loop_guard", "todo_reminder", "cycle_state",
                "ledger", "status", "added", "generated"]
# one colour per region everywhere (strip figure, sample browser): Okabe-Ito, the status bar in
# vermillion and the other mechanisms' text in reddish purple or sky blue so they stand out; greys for scaffolding
REGION_COLORS = {"template": "#BBBBBB", "system": "#777777", "summary": "#999999", "request": "#009E73",
                 "call_records": "#0072B2", "other_call": "#56B4E9", "distractor": "#F0E442", "assistant": "#E69F00",
                 "question": "#000000", "turn_meta": "#CC79A7", "diagnostics": "#CC79A7", "envelope": "#CC79A7",
                 "loop_guard": "#CC79A7", "todo_reminder": "#56B4E9", "cycle_state": "#56B4E9", "ledger": "#56B4E9",
                 "status": "#D55E00", "added": "#CC79A7", "generated": "#444444"}

RC = {
    "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "axes.grid.axis": "y", "grid.color": "#DDDDDD", "grid.linewidth": 0.5, "axes.axisbelow": True,
    "legend.frameon": False, "savefig.bbox": "tight", "savefig.dpi": 200, "pdf.fonttype": 42,
}
FULL_WIDTH = 7.0  # inches: a two-column paper's text width
COLUMN_WIDTH = 3.4


def colors(names: Iterable[str]) -> dict[str, str]:
    """A stable colour per name, in the order the names first appear."""
    return {n: OKABE_ITO[i % len(OKABE_ITO)] for i, n in enumerate(dict.fromkeys(names))}


def region_colors(names: Iterable[str] = ()) -> dict[str, str]:
    """REGION_COLORS, plus a stable colour for any other region name."""
    extra = [n for n in dict.fromkeys(names) if n not in REGION_COLORS]
    return {**REGION_COLORS, **colors(extra)}


def ordered_regions(regions: Iterable[str]) -> list[str]:
    """Regions in REGION_ORDER, then any others by name."""
    present = set(regions)
    return [r for r in REGION_ORDER if r in present] + sorted(present - set(REGION_ORDER))


def num(x: float, digits: int = 3) -> str:
    """A number in `digits` significant digits, with float noise around zero (1e-15) shown as 0."""
    return f"{0.0 if abs(x) < 1e-9 else x:.{digits}g}"


@contextmanager
def paper_style() -> Iterator[None]:
    import matplotlib as mpl

    with mpl.rc_context(RC):
        yield


def save(fig, out_dir: Path, name: str) -> list[Path]:
    """Write name.png and name.pdf into out_dir; returns both paths."""
    # the PDF backend's font subsetting logs every glyph at INFO, which floods a run's log under Hydra
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    with paper_style():
        for p in paths:
            with atomic_path(p) as tmp:  # a full disk leaves no empty figure behind
                fig.savefig(tmp, format=p.suffix[1:],
                            metadata={"Software": "statusbench"} if p.suffix == ".png" else {"Creator": "statusbench"})
    return paths

"""A part of the report, as every section maker returns it, and the escaping of data put into it."""
from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

# characters that open markdown inline markup (links, images, emphasis, code, HTML, entities, table
# pipes), CommonMark lets a backslash escape any ASCII punctuation; an underscore between two letters
# or digits opens no emphasis, so `status_tail` stays as written
_MARKUP = re.compile(r"[\\`*\[\]<>!&|]|(?<![^\W_])_|_(?![^\W_])")


def md_text(value: object) -> str:
    """Data (a server's error text, an id, a cell from a record) as markdown that renders as exactly
    that text: `![k](/proc/self/environ)` stays those characters, never an image or a link."""
    return _MARKUP.sub(lambda m: "\\" + m.group(), " ".join(str(value).splitlines()))


def md_table(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with every text cell and heading escaped (numbers stay numbers, for tabulate's alignment)."""
    cells = table.map(lambda v: md_text(v) if isinstance(v, str) else v)
    return cells.rename(columns=lambda c: md_text(c))


@dataclass
class Section:
    """One part of the report: a heading, a paragraph, optionally a table and/or a figure (a file
    name, without suffix, of a PNG in the output directory, written by the section's maker)."""

    title: str
    text: str = ""
    table: pd.DataFrame | None = None
    figure: str | None = None


def ci(est: pd.Series, low: pd.Series, high: pd.Series, fmt: str = ".2f") -> list[str]:
    """Each estimate with its interval, `0.50 [0.31, 0.69]`; `–` where unknown (`0.50 [–, –]`: an interval
    that could not be computed)."""
    def f(x: float) -> str:
        return "–" if pd.isna(x) else f"{0.0 if abs(x) < 1e-9 else x:{fmt}}"  # float noise around 0 shows as 0

    return ["–" if pd.isna(e) else f"{f(e)} [{f(lo)}, {f(hi)}]" for e, lo, hi in zip(est, low, high)]

"""A part of the report, as every section maker returns it."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class Section:
    """One part of the report: a heading, a paragraph, optionally a table and/or a figure (a file
    name, without suffix, of a PNG in the output directory)."""

    title: str
    text: str = ""
    table: pd.DataFrame | None = None
    figure: str | None = None

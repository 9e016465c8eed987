# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # statusbench: the paper figures
#
# Rebuilds every figure of `python -m analysis.report` from run directories, one cell per figure,
# with the table behind it. Open with Jupyter (jupytext reads this `.py` as a notebook) or run as
# a script. Set `STATUSBENCH_RUNS` to run directories separated by `:` (default: every run under
# `../results`), and `STATUSBENCH_FIGURES` to where PNG and PDF files go (default `figures/`).

# %%
# %matplotlib inline
import os
from pathlib import Path

from analysis import figures, tables
from analysis.load import load_records, runs_from_env
from analysis.style import save

RUNS = runs_from_env("../results")
OUT = Path(os.environ.get("STATUSBENCH_FIGURES", "figures"))
df = load_records(RUNS)
print(f"{len(df)} records from {len(RUNS)} runs: {', '.join(df['run_label'].unique())}")

# %% [markdown]
# ## Accuracy by condition and model (Wilson 95% intervals)

# %%
tables.rates(df, ["run_label", "condition"])[["run_label", "condition", "n", "accuracy", "acc_low", "acc_high"]]

# %%
fig = figures.accuracy(df)
save(fig, OUT, "accuracy_by_condition")
fig

# %% [markdown]
# ## Thinking tokens against context length, fitted line per condition
#
# The seed's claim: without the status bar thinking grows with the context; with it, it stays flat.

# %%
tables.thinking(df)

# %%
fig = figures.thinking_vs_context(df)  # a sentence instead of a figure when the records carry no token counts
if not isinstance(fig, str):
    save(fig, OUT, "thinking_vs_context")
fig

# %% [markdown]
# ## Cost per correct answer
#
# In tokens always; in US$ where the records carry `cost_usd`.

# %%
tables.cost_latency(df)

# %%
fig = figures.cost_per_correct(df)
save(fig, OUT, "cost_per_correct")
fig

# %% [markdown]
# ## Outcome breakdown per condition

# %%
tables.outcomes(df)

# %%
fig = figures.outcomes(df)
save(fig, OUT, "outcomes")
fig

# %% [markdown]
# ## Control cells (over-refusal) beside limit cells (violations)

# %%
tables.cells(df)

# %%
fig = figures.control_vs_limit(df)
save(fig, OUT, "control_vs_limit")
fig

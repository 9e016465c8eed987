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
# # statusbench: is the difference between two conditions real?
#
# The paired analysis behind the report: both conditions saw the same episodes and replicates, so
# each sample has a twin. Set `STATUSBENCH_RUNS` as in `figures.py`.

# %%
from analysis import tables
from analysis.load import load_records, runs_from_env

RUNS = runs_from_env("../results")
df = load_records(RUNS)

# %% [markdown]
# ## Every condition against the baseline (`none`)
#
# `only_a`: right without the mechanism only; `only_b`: right with it only. McNemar's exact test
# uses just these discordant pairs; the interval of the difference resamples whole episodes.

# %%
tables.comparisons(df)

# %% [markdown]
# ## The same comparison in each cell of the scenario grid

# %%
tables.comparisons(df, cells=True)

# %% [markdown]
# ## pass^k over replicates and the growth of thinking with context

# %%
tables.pass_k(df)

# %%
tables.thinking(df)[["run_label", "condition", "n", "slope_per_1k", "slope_low", "slope_high", "slope_p"]]

"""Validation of a whole run before Hydra writes anything.

Hydra creates the run directory and its `.hydra/` files before the task function starts, so a
config refused only there would still leave files behind (outside run.root for a hostile
experiment.name, or over a running run's `.hydra/` for a refused second writer). The `Preflight`
callback (registered in conf/config.yaml) runs at `on_run_start`, after composition and before
any write: it types the config (schemas, unknown keys, names, plan size, each part's `check_machine`),
verifies a model's pinned PyPI parts (harness.models.parts), builds the episodes and runs the
backend's `preflight` (a user's traces and scripted completions: refused naming file, line and field)
and probes the writer lock.
A multirun checks its base config here; a swept value is checked as its job starts, after Hydra
has written that job's directory.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

import scenarios
from harness.config.compose import to_typed
from harness.config.schemas import BackendConfig, ModelConfig, ScenarioConfig
from harness.errors import ConfigError
from harness.models import sources
from harness.rundir.layout import shard_dir
from harness.rundir.store import RunDirError, probe_lock


def task_config(config: DictConfig) -> DictConfig:
    """The config the task function will get: Hydra's own node removed."""
    task = copy.deepcopy(config)
    with open_dict(task):
        task.pop("hydra", None)
    return task


def check(model: ModelConfig, scenario: ScenarioConfig, backend: BackendConfig, job_dir: Path | None) -> None:
    """Everything that can refuse this run without loading a model; ConfigError/RunDirError."""
    sources.check_parts(model)  # a missing, truncated or altered part: refused before any write
    scenarios.build_episodes(scenario)  # a user's traces are read and checked here
    backend.preflight()  # e.g. every line of a scripted completions file
    if job_dir is not None:
        probe_lock(job_dir)


def _refuse(exc: Exception | str) -> None:
    print(f"statusbench: error: {exc}", file=sys.stderr)
    sys.exit(2)


class Preflight(Callback):
    def _run(self, config: DictConfig, dir_key: str | None) -> None:
        run_dir = Path(str(OmegaConf.select(config, dir_key))) if dir_key else None
        try:
            cfg = to_typed(task_config(config))
            check(cfg.model, cfg.scenario, cfg.backend, shard_dir(run_dir, cfg.run.shard_spec) if run_dir else None)
        except (ConfigError, RunDirError) as exc:
            _refuse(exc)
        if run_dir is not None:  # the config is accepted: create the directory Hydra would, failing in words
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                _refuse(f"run.root: cannot create the run directory {run_dir} ({exc.strerror or exc}); "
                        "choose a writable run.root")

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._run(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._run(config, None)

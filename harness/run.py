"""`python -m harness.run`: plan -> generate in batches -> grade -> append records -> report.

Configuration is validated completely before any model loads; finished samples are skipped, so a
rerun of the same command makes no model call and an interrupted run continues where it stopped.
"""
from __future__ import annotations

import os
import signal
from contextlib import nullcontext
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from harness.agent import loop as agent_loop
from harness.backends import Backend, make_backend
from harness.config.compose import CONF_DIR, register, to_typed, user_errors
from harness.config.schemas import Config, Mode
from harness.errors import ConfigError
from harness.flow import stages
from harness.flow.plan import make_plan
from harness.io.files import os_error_message
from harness.io.secrets import argv_secret_error
from harness.rundir import manifest
from harness.rundir.store import RunDirError

register()
MAX_YAML_NODES = 1_000_000  # a config file copied out; far above any real one


def execute(cfg: Config, resolved: dict[str, Any], run_dir: Path, backend: Backend | None = None) -> dict[str, int]:
    """Run every pending sample of the plan into run_dir (a shard: its own subdirectory). Returns
    counts for the caller. `backend`: an already loaded one (the benchmark's); default: load cfg's."""
    plan = make_plan(cfg)
    with stages.open_run(cfg, Path(run_dir), resolved) as run:
        todo = stages.pending(plan, run, cfg.run.retry_errors)
        print(f"statusbench: {len(plan)} samples planned, {len(plan) - len(todo)} already done, "
              f"{len(todo)} new -> {run.job_dir}", flush=True)
        # the model loads only when there is work; a caller's backend (the benchmark's) is the caller's to close
        with nullcontext(backend) if backend or not todo else make_backend(cfg.model, cfg.backend) as loaded:
            session = stages.start_session(run, len(plan), len(todo))
            if todo:
                loaded.attach(run.job_dir)
                stages.generate_all(run, todo, loaded, stages.RecordContext(cfg.model, cfg.backend.name), cfg.probe,
                                    cfg.run.batch_size, cfg.run.progress)
        session["finished_at"] = manifest.now()
        run.write_manifest(session)
    return {"planned": len(plan), "new": len(todo)}


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(dcfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        cfg = to_typed(dcfg)
        # SIGTERM (a scheduler's kill, `timeout`) ends the run like Ctrl-C: what is written is kept, said in one line
        signal.signal(signal.SIGTERM, _interrupt)
        rollouts = cfg.experiment.mode == Mode.rollouts
        flow = agent_loop.execute if rollouts else execute
        counts = flow(cfg, OmegaConf.to_container(dcfg, resolve=True), run_dir)
        if cfg.run.report and not counts["planned"]:  # no episode hashed to this shard: no records to report on
            print(f"statusbench: run.shard={cfg.run.shard} holds none of the plan's episodes; no report")
        elif cfg.run.report and rollouts:
            from analysis.rollouts import summary_lines, write_rollout_report  # analysis loads only here (see below)

            write_rollout_report(run_dir)
            for line in summary_lines(run_dir):
                print(f"statusbench: {line}")
        elif cfg.run.report:
            # the last stage; analysis stands above the harness (pandas, matplotlib), so it loads only here
            from analysis.load import load_records
            from analysis.report import write_report
            from analysis.summary import summary_lines

            write_report([run_dir])
            for line in summary_lines(load_records([run_dir]), run_dir):
                print(f"statusbench: {line}")
    except KeyboardInterrupt:
        kept = stages.records_kept(run_dir)
        print(f"statusbench: interrupted: {kept} records kept in {run_dir}; run the same command to continue",
              file=sys.stderr)
        sys.exit(130)
    except (ConfigError, RunDirError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # a full or read-only disk: said in words, what was written is kept
        print(f"statusbench: error: {os_error_message(exc)}", file=sys.stderr)
        sys.exit(2)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def check_yaml(argv: list[str]) -> None:
    """Hydra shows a YAML syntax error as a library traceback; name the file and line instead."""
    import yaml

    dirs = [CONF_DIR]
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
    for path in (p for d in dirs for p in sorted(d.rglob("*.yaml"))):
        try:
            text = path.read_text()
            # aliases are shared by PyYAML but copied by OmegaConf: a "billion laughs" file hangs it for minutes
            if expanded_nodes(yaml.compose(text, Loader=yaml.SafeLoader)) > MAX_YAML_NODES:
                print(f"statusbench: error: {path}: its aliases expand to more than {MAX_YAML_NODES} nodes "
                      "(a YAML alias bomb?); refused before loading", file=sys.stderr)
                sys.exit(2)
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            print(f"statusbench: error: malformed YAML in {path}{where}: {getattr(exc, 'problem', exc)}", file=sys.stderr)
            sys.exit(2)


def expanded_nodes(root: Any) -> int:
    """Nodes of a composed YAML document once every alias is copied out (as OmegaConf does), counted
    in time linear in the file: each distinct node's size once. A node holding itself counts as
    unbounded."""
    import yaml

    sizes: dict[int, float] = {}

    def size(node: Any) -> float:
        key = id(node)
        if key not in sizes:
            sizes[key] = float("inf")  # while counting: reached again means the node holds itself
            children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                        else node.value if isinstance(node, yaml.SequenceNode) else [])
            sizes[key] = 1 + sum(size(c) for c in children)
        return sizes[key]

    return size(root) if root is not None else 0


def check_secrets(argv: list[str]) -> None:
    """A key on the command line is refused before Hydra composes (its own errors echo values) or writes."""
    message = argv_secret_error(argv)
    if message:
        print(f"statusbench: error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_secrets(sys.argv[1:])
    check_yaml(sys.argv[1:])
    # Hydra prints its own errors (a typo'd key or option) as several lines, exit 1; raised, they are
    # said in one line with a did-you-mean and exit 2 (user_errors), like every other bad config
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    with user_errors():
        main()

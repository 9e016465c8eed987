"""`python -m harness.run`: plan -> open -> resume -> rounds of [view -> write bars -> generate ->
grade -> probe -> act -> append] until every episode's environment is done -> report.

One flow for every run: a single decision on a frozen trajectory is a one-step rollout, and
`experiment.mode=rollouts` runs each episode live (harness.agent.env). Configuration is validated
completely before any model loads; finished steps are skipped, so a rerun of the same command makes
no model call and an interrupted run continues where it stopped.
"""
from __future__ import annotations

import os
import signal
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator, NoReturn

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from harness.backends import Backend, make_backend
from harness.config.compose import CONF_DIR, register, to_typed, user_errors
from harness.config.schemas import Config
from harness.errors import ConfigError
from harness.flow import stages
from harness.flow.plan import PlanSpec, make_plan
from harness.flow.rounds import RoundSettings, Step, run_rounds, view_step
from harness.io.files import os_error_message
from harness.io.jsonl import read_regular
from harness.io.secrets import argv_secret_error
from harness.rundir import manifest
from harness.rundir.store import RunDirError

register()
MAX_YAML_NODES = 1_000_000  # a config file copied out; far above any real one


def plan_spec(cfg: Config) -> PlanSpec:
    """The pieces of the config that decide the plan (and the run's fingerprint)."""
    return PlanSpec(scenario=cfg.scenario, conditions=cfg.conditions, model=cfg.model, backend=cfg.backend,
                    replicates=cfg.experiment.replicates, seed=cfg.experiment.seed, rollout=cfg.rollouts,
                    shard=cfg.run.shard_spec, propensity=cfg.probe.propensity, max_samples=cfg.run.max_samples)


def round_settings(cfg: Config) -> RoundSettings:
    return RoundSettings(cfg.model, cfg.backend.name, cfg.run.batch_size, cfg.run.progress, cfg.probe.propensity)


def first_steps(cfg: Config) -> list[Step]:
    """Every rollout's first model call as the run builds it (a single decision's only one): its
    request, episode and condition. For tools and tests that drive a backend below the run."""
    return [view_step(r, round_settings(cfg), r.index) for r in make_plan(plan_spec(cfg))]


def execute(cfg: Config, resolved: dict[str, Any], run_dir: Path, backend: Backend | None = None) -> dict[str, int]:
    """Run every unfinished step of the plan into run_dir (a shard: its own subdirectory). Returns
    counts for the caller. `backend`: an already loaded one (the benchmark's); default: load cfg's."""
    spec = plan_spec(cfg)
    plan = make_plan(spec)
    with stages.open_run(spec, Path(run_dir), cfg.run.extend, resolved) as run:
        pending = stages.resume(plan, run, cfg.run.retry_errors)
        unit = "samples" if spec.rollout is None else "rollouts"
        print(f"statusbench: {len(plan)} {unit} planned, {len(plan) - len(pending.active)} already done, "
              f"{len(pending.active)} new -> {run.job_dir}", flush=True)
        # the model loads only when there is work; a caller's backend (the benchmark's) is the caller's to close
        with nullcontext(backend) if backend or not pending.active else make_backend(cfg.model, cfg.backend) as loaded:
            session = stages.start_session(run, len(plan), len(pending.active))
            stages.record_rollouts(run, pending.unrecorded)  # killed after a rollout's last step, before its record
            if pending.active:
                loaded.attach(run.job_dir)
                run_rounds(run, plan, pending, loaded, round_settings(cfg), cfg.probe)
        session["finished_at"] = manifest.now()
        run.write_manifest(session)
    return {"planned": len(plan), "new": len(pending.active)}


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(dcfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        cfg = to_typed(dcfg)
        # SIGTERM (a scheduler's kill, `timeout`) ends the run like Ctrl-C: what is written is kept, said in one line
        signal.signal(signal.SIGTERM, _interrupt)
        counts = execute(cfg, OmegaConf.to_container(dcfg, resolve=True), run_dir)
        if cfg.run.report and not counts["planned"]:  # no episode hashed to this shard: no records to report on
            print(f"statusbench: run.shard={cfg.run.shard} holds none of the plan's episodes; no report")
        elif cfg.run.report:
            # the last stage; analysis stands above the harness (pandas, matplotlib), so it loads only here
            from analysis.load import load_records, load_rollouts
            from analysis.report import write_report
            from analysis.summary import summary_lines

            write_report([run_dir])
            for line in summary_lines(load_records([run_dir]), run_dir, load_rollouts([run_dir])):
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
    """Every YAML file of every config source Hydra reads (conf/, --config-path, --config-dir, each
    hydra.searchpath entry of the command line or else of the primary config): Hydra shows a YAML
    syntax error as a library traceback, so the file and line are named instead, and an alias bomb
    is refused before OmegaConf copies it out."""
    flags = _config_flags(argv)
    primary = f"{flags.get('--config-name', 'config')}.yaml"
    folders = [CONF_DIR] + [Path(flags[f]) for f in ("--config-path", "--config-dir") if f in flags]
    searchpath = _searchpath_override(argv)
    for folder in folders:
        for path in _yaml_files(folder):
            loaded = _checked_yaml(path)
            hydra_node = loaded.get("hydra") if path == folder / primary and isinstance(loaded, dict) else None
            if searchpath is None and isinstance(hydra_node, dict):  # the command line's replaces the config's
                searchpath = hydra_node.get("searchpath")
    for folder in _searchpath_dirs(searchpath):
        for path in _yaml_files(folder):
            _checked_yaml(path)


CONFIG_FLAGS = {"-cp": "--config-path", "-cn": "--config-name", "-cd": "--config-dir"}
MAX_CONFIG_FOLDERS = 2_000  # folders walked per config source: `file:///` is not a config folder


def _config_flags(argv: list[str]) -> dict[str, str]:
    """Hydra's --config-path/-cp, --config-name/-cn and --config-dir/-cd, as `--long: value`."""
    flags = {}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        name = CONFIG_FLAGS.get(name, name)
        if name in CONFIG_FLAGS.values():
            if eq:
                flags[name] = value
            elif i + 1 < len(argv):
                flags[name] = argv[i + 1]
    if "--config-path" in flags and not Path(flags["--config-path"]).is_absolute():  # Hydra: relative to this file
        flags["--config-path"] = str(Path(__file__).parent / flags["--config-path"])
    return flags


def _searchpath_override(argv: list[str]) -> Any:
    """The value of a `hydra.searchpath=[...]` override (Hydra's own parser), or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in argv:
        if not arg.startswith("-") and "searchpath" in arg.split("=", 1)[0]:
            try:
                override = parser.parse_override(arg)
            except HydraException:  # Hydra says what is wrong with it, in one line (user_errors)
                continue
            if override.get_key_element() == "hydra.searchpath":
                return override.value()
    return None


def _searchpath_dirs(searchpath: Any) -> list[Path]:
    """The folders a searchpath's entries name: `file://DIR` (or a bare DIR) and `pkg://PACKAGE`, a
    package's folder; entries Hydra will refuse (not a list of strings) are left to it."""
    import importlib.util

    folders = []
    for entry in searchpath if isinstance(searchpath, (list, tuple)) else []:
        scheme, sep, where = str(entry).partition("://")
        if not sep:
            scheme, where = "file", str(entry)
        if scheme == "file":
            folders.append(Path(where))
        elif scheme == "pkg":
            try:
                spec = importlib.util.find_spec(where.replace("/", ".").rstrip("."))
            except (ImportError, ValueError):  # Hydra names a package it cannot find
                continue
            folders += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return folders


def _yaml_files(folder: Path) -> Iterator[Path]:
    """The .yaml files under folder (links to folders not followed), at most MAX_CONFIG_FOLDERS
    folders deep in all: a searchpath at `/` is refused, not walked for minutes."""
    for n, (root, _, files) in enumerate(os.walk(folder)):
        if n >= MAX_CONFIG_FOLDERS:
            _refuse(f"{folder}: more than {MAX_CONFIG_FOLDERS} folders to read as a config source; "
                    "name the folder that holds the configs")
        yield from (Path(root) / f for f in sorted(files) if f.endswith(".yaml"))


def _checked_yaml(path: Path) -> Any:
    """The file's YAML, or exit 2 naming it: malformed, or an alias bomb."""
    try:
        # a FIFO or a device named *.yaml would block or never end: only a regular file is read
        text = read_regular(path, error=OSError).decode("utf-8")
        # aliases are shared by PyYAML but copied by OmegaConf: a "billion laughs" file hangs it for minutes
        if expanded_nodes(yaml.compose(text, Loader=yaml.SafeLoader)) > MAX_YAML_NODES:
            _refuse(f"{path}: its aliases expand to more than {MAX_YAML_NODES} nodes "
                    "(a YAML alias bomb?); refused before loading")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        _refuse(f"malformed YAML in {path}{where}: {getattr(exc, 'problem', exc)}")
    except OSError as exc:  # read_regular's message names the path and what it is
        _refuse(str(exc))
    except UnicodeDecodeError:
        _refuse(f"{path}: not UTF-8 text, so no YAML config")


def _refuse(message: str) -> NoReturn:
    print(f"statusbench: error: {message}", file=sys.stderr)
    sys.exit(2)


def expanded_nodes(root: Any) -> int:
    """Nodes of a composed YAML document once every alias is copied out (as OmegaConf does), counted
    in time linear in the file: each distinct node's size once. A node holding itself counts as
    unbounded."""
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
        _refuse(message)


if __name__ == "__main__":
    check_secrets(sys.argv[1:])
    check_yaml(sys.argv[1:])
    # Hydra prints its own errors (a typo'd key or option) as several lines, exit 1; raised, they are
    # said in one line with a did-you-mean and exit 2 (user_errors), like every other bad config
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    with user_errors():
        main()

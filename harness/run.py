"""`python -m harness.run`: plan -> generate in batches -> grade -> append records -> report.

Configuration is validated completely before any model loads; finished samples are skipped, so a
rerun of the same command makes no model call and an interrupted run continues where it stopped.
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import scenarios
from harness import progress
from harness.backends import Backend
from harness.config.compose import CONF_DIR, register, to_typed
from harness.config.schemas import Config
from harness.errors import ConfigError
from harness.flow.fingerprint import admit
from harness.flow.plan import Sample, make_plan
from harness.flow.writer import WriterBackends, fail_unwritten, write_bars
from harness.measure.cost import cost_usd
from harness.rundir import manifest
from harness.rundir.layout import run_parts, shard_dir
from harness.rundir.store import RunDirError, RunStore, prompt_hash
from harness.types import Completion, Record, short_hash

register()


def to_record(sample: Sample, completion: Completion, cfg: Config, prompt_sha: str,
              writer: dict[str, Any] | None = None) -> Record:
    label, correct, calls = scenarios.grade(sample.episode, completion)  # the family's own grader
    req = sample.request
    return Record(
        sample_id=req.sample_id, episode_id=req.episode_id, scenario=sample.episode.scenario,
        family=sample.episode.family, params=sample.episode.params, condition=sample.condition,
        condition_config=asdict(sample.condition_cfg), model=cfg.model.name,
        model_path=cfg.model.weights, backend=cfg.backend.name,
        generation=asdict(req.generation), replicate=req.replicate, seed=req.seed, prompt_sha256=prompt_sha,
        prompt_tokens=completion.prompt_tokens, cached_prompt_tokens=completion.cached_prompt_tokens,
        completion_tokens=completion.completion_tokens, thinking_tokens=completion.thinking_tokens,
        answer_tokens=completion.answer_tokens, text=completion.text, reasoning=completion.reasoning,
        tool_calls=[asdict(c) for c in calls], label=label, correct=correct, expected=sample.episode.expected,
        latency_s=completion.latency_s, finish_reason=completion.finish_reason, error=completion.error,
        scripted=completion.scripted, cost_usd=cost_usd(cfg.model, completion), ttft_s=completion.ttft_s, writer=writer,
        token_source=completion.token_source, propensity=completion.propensity,
        created_at=manifest.now("microseconds"))  # to the microsecond: the newest record of a sample wins


def execute(cfg: Config, resolved: dict[str, Any], run_dir: Path, backend: Backend | None = None) -> dict[str, int]:
    """Run every pending sample of the plan into run_dir (a shard: its own subdirectory). Returns
    counts for the caller. `backend`: an already loaded one (the benchmark's); default: load cfg's."""
    from tqdm import tqdm

    plan = make_plan(cfg)
    run_dir = Path(run_dir)
    job_dir = shard_dir(run_dir, cfg.run.shard_spec)
    admission = admit(cfg, run_dir, job_dir, manifest.now())  # before anything is written
    save_hydra_record(job_dir, resolved)
    with RunStore(job_dir) as store:
        # a sample done anywhere in the run (its parent or any shard) is done for every job of it
        elsewhere = [d for d in run_parts(run_dir) if d != job_dir]
        done = store.done_ids(cfg.run.retry_errors, elsewhere)
        pending = [s for s in plan if s.sample_id not in done]
        print(f"statusbench: {len(plan)} samples planned, {len(plan) - len(pending)} already done, "
              f"{len(pending)} new -> {job_dir}", flush=True)
        sessions = store.read_manifest().get("sessions", [])
        session = {"started_at": manifest.now(), "argv": sys.argv[1:], "planned": len(plan), "new": len(pending),
                   "fingerprint": short_hash(admission.current)}
        model_info = {**cfg.model.identity(), "backend": cfg.backend.name}
        store.write_manifest(manifest.build(resolved, model_info, sessions + [session], admission.record()))
        if pending:
            from harness.backends import hf_weights, make_backend

            backend = backend or make_backend(cfg)  # the model loads only when there is work to do
            model_info.update(backend.describe())
            writers = WriterBackends(cfg, backend)
            if cfg.probe.propensity and not hf_weights(backend):  # unmeasured is said, not shown as a score
                print(f"statusbench: probe.propensity: the {backend.name} backend cannot score candidates; "
                      "records carry propensity null", flush=True)
            probe = None
            if cfg.probe.attention:
                from harness.flow.probe import RunProbe

                probe = RunProbe(cfg, backend, job_dir)
                model_info["attention_probe"] = probe.describe()
            with tqdm(total=len(pending), unit="sample", desc="generate", disable=not cfg.run.progress,
                      dynamic_ncols=True) as bar:
                for start in range(0, len(pending), cfg.run.batch_size):
                    batch = pending[start:start + cfg.run.batch_size]
                    batch, written = write_bars(batch, writers)  # stage one of source=model conditions; {} for others
                    with progress.reporting(bar.update, len(batch)):  # the bar moves per finished sample
                        completions = fail_unwritten(batch, backend.generate([s.request for s in batch]), written)
                    if len(completions) != len(batch):
                        raise RuntimeError(f"backend {backend.name} returned {len(completions)} completions for {len(batch)} requests")
                    records, prompts = [], []
                    for sample, completion in zip(batch, completions):
                        sha = prompt_hash(completion.prompt_text, sample.request.messages, sample.request.tools)
                        prompts.append({"prompt_sha256": sha, "messages": sample.request.messages,
                                        "tools": sample.request.tools, "rendered": completion.prompt_text})
                        records.append(to_record(sample, completion, cfg, sha, written.get(sample.sample_id)))
                    if probe:
                        probe.annotate(batch, completions, records)
                    store.append(records, prompts)
        session["finished_at"] = manifest.now()
        store.write_manifest(manifest.build(resolved, model_info, sessions + [session], admission.record()))
    return {"planned": len(plan), "new": len(pending)}


def save_hydra_record(job_dir: Path, resolved: dict[str, Any]) -> None:
    """.hydra/ of the job: written here, after the fingerprint check, because Hydra's own dump (off in
    conf/config.yaml) would overwrite the record of a run this job is then refused into."""
    if not HydraConfig.initialized():
        return
    out = job_dir / ".hydra"
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(resolved), out / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(HydraConfig.get().overrides.task)), out / "overrides.yaml")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(dcfg: DictConfig) -> None:
    try:
        cfg = to_typed(dcfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        counts = execute(cfg, OmegaConf.to_container(dcfg, resolve=True), run_dir)
        if cfg.run.report and not counts["planned"]:  # no episode hashed to this shard: no records to report on
            print(f"statusbench: run.shard={cfg.run.shard} holds none of the plan's episodes; no report")
        elif cfg.run.report:
            from analysis.report import write_report

            print(write_report([run_dir]))
    except (ConfigError, RunDirError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # a full or read-only disk: said in words, what was written is kept
        from harness.io.files import os_error_message

        print(f"statusbench: error: {os_error_message(exc)}", file=sys.stderr)
        sys.exit(2)


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
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            print(f"statusbench: error: malformed YAML in {path}{where}: {getattr(exc, 'problem', exc)}", file=sys.stderr)
            sys.exit(2)


def check_secrets(argv: list[str]) -> None:
    """A key on the command line is refused before Hydra composes (its own errors echo values) or writes."""
    from harness.io.secrets import argv_secret_error

    message = argv_secret_error(argv)
    if message:
        print(f"statusbench: error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_secrets(sys.argv[1:])
    check_yaml(sys.argv[1:])
    main()

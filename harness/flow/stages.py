"""The run's stages, each a function with typed inputs and outputs; `harness.run.execute` calls them
in order: plan -> open (lock, admit, record the config) -> pending -> per batch: write model bars ->
generate -> grade -> probe -> append -> close the session.

A single decision on a frozen trajectory is the one-step case of a rollout: the same
generate/grade/append stages run once per sample.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

import scenarios
from harness import progress
from harness.backends import Backend
from harness.config.schemas import Config, ModelConfig, ProbeConfig
from harness.flow.fingerprint import Admission, admit
from harness.flow.plan import Sample
from harness.flow.probe import RunProbe
from harness.flow.writer import WriterBackends, unwritten, write_bars
from harness.measure.cost import cost_usd
from harness.measure.grading import call_format
from harness.rundir import manifest
from harness.rundir.layout import RECORDS, run_parts, shard_dir
from harness.rundir.store import RunStore, prompt_hash
from harness.types import Completion, Record, Request, short_hash


@dataclass
class OpenRun:
    """A run directory this process writes: its lock held, its experiment admitted."""
    run_dir: Path
    job_dir: Path  # the run, or its shard
    store: RunStore
    admission: Admission
    resolved: dict[str, Any]
    sessions: list[dict[str, Any]] = field(default_factory=list)  # the earlier invocations
    model_info: dict[str, Any] = field(default_factory=dict)

    def write_manifest(self, session: dict[str, Any]) -> None:
        self.store.write_manifest(manifest.build(self.resolved, self.model_info, self.sessions + [session],
                                                 self.admission.record()))


@contextmanager
def open_run(cfg: Config, run_dir: Path, resolved: dict[str, Any]) -> Iterator[OpenRun]:
    """Take the job directory's writer lock first, then admit the experiment: a process refused (in
    use, another experiment) has written nothing. The config is recorded by `start_session`."""
    job_dir = shard_dir(Path(run_dir), cfg.run.shard_spec)
    with RunStore(job_dir) as store:
        admission = admit(cfg, Path(run_dir), job_dir, manifest.now())
        yield OpenRun(Path(run_dir), job_dir, store, admission, resolved, store.read_manifest().get("sessions", []),
                      {**cfg.model.identity(), "backend": cfg.backend.name})


def save_hydra_record(job_dir: Path, resolved: dict[str, Any]) -> None:
    """.hydra/ of the job: written after the lock and the fingerprint check, because Hydra's own dump
    (off in conf/config.yaml) would overwrite the record of a run this job is then refused into."""
    if not HydraConfig.initialized():
        return
    out = job_dir / ".hydra"
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(resolved), out / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(HydraConfig.get().overrides.task)), out / "overrides.yaml")


def pending(plan: list[Sample], run: OpenRun, retry_errors: bool) -> list[Sample]:
    """The samples without a record anywhere in the run (its parent or any shard)."""
    elsewhere = [d for d in run_parts(run.run_dir) if d != run.job_dir]
    done = run.store.done_ids(retry_errors, elsewhere)
    return [s for s in plan if s.sample_id not in done]


def start_session(run: OpenRun, planned: int, new: int) -> dict[str, Any]:
    """Record the config (.hydra/) and this invocation in the manifest: once the model has loaded, so
    a model that fails to load leaves no manifest to block the corrected command."""
    save_hydra_record(run.job_dir, run.resolved)
    session = {"started_at": manifest.now(), "argv": sys.argv[1:], "planned": planned, "new": new,
               "fingerprint": short_hash(run.admission.current)}
    run.write_manifest(session)
    return session


def generate_all(run: OpenRun, todo: list[Sample], backend: Backend, ctx: RecordContext, probe_cfg: ProbeConfig,
                 batch_size: int, show_progress: bool) -> None:
    """Per batch: write model bars -> generate -> grade -> probe -> append."""
    from tqdm import tqdm

    run.model_info.update(backend.describe())
    writers = WriterBackends(ctx.model, backend)
    if probe_cfg.propensity and not backend.scores_candidates():  # unmeasured is said, not shown as a score
        print(f"statusbench: probe.propensity: the {backend.name} backend cannot score candidates; "
              "records carry propensity null", flush=True)
    probe = RunProbe(ctx.model, probe_cfg, backend, run.job_dir) if probe_cfg.attention else None
    if probe:
        run.model_info["attention_probe"] = probe.describe()
    # the backend moves the bar by fractions of a sample as it computes (harness.progress.Work); miniters=0:
    # every move redraws (at most every 0.1 s), where tqdm's own would wait for a whole sample
    with tqdm(total=len(todo), unit="sample", desc="generate", disable=not show_progress, dynamic_ncols=True,
              miniters=0, bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]") as bar:
        for batch in batches(todo, batch_size):
            batch, written = write_bars(batch, writers)  # source=model conditions; {} for others
            completions = generate(backend, batch, written, bar.update)
            records, prompts = grade(batch, completions, ctx, written)
            if probe:
                probe.annotate(batch, completions, records)
            run.store.append(records, prompts)
    run.model_info.update(backend.describe())  # what generating told (e.g. the model a server reported)


def batches(samples: list[Sample], size: int) -> Iterator[list[Sample]]:
    for start in range(0, len(samples), size):
        yield samples[start:start + size]


def generate(backend: Backend, batch: list[Sample], written: dict[str, dict[str, Any]],
             on_sample: Callable[[int], None]) -> list[Completion]:
    """One completion per sample, in order; a sample whose model-written bar failed is an error,
    without asking the backend."""
    failed = {s.sample_id: c for s in batch if (c := unwritten(written.get(s.sample_id, {})))}
    ready = [s for s in batch if s.sample_id not in failed]
    if failed:
        on_sample(len(failed))  # done: nothing to compute
    with progress.reporting(on_sample, len(ready)):
        answered = backend.generate([s.request for s in ready]) if ready else []
    if len(answered) != len(ready):
        raise RuntimeError(f"backend {backend.name} returned {len(answered)} completions for {len(ready)} requests")
    answers = iter(answered)
    return [failed.get(s.sample_id) or next(answers) for s in batch]


@dataclass(frozen=True)
class RecordContext:
    """What a record says of the run besides the sample: the model and the backend's name."""
    model: ModelConfig
    backend: str


def grade(batch: list[Sample], completions: list[Completion], ctx: RecordContext,
          written: dict[str, dict[str, Any]]) -> tuple[list[Record], list[dict[str, Any]]]:
    """Each sample's record (graded by its family) and the prompt rows it points at."""
    records, prompts = [], []
    for sample, completion in zip(batch, completions):
        row = prompt_row(sample.request, completion)
        prompts.append(row)
        records.append(to_record(sample, completion, ctx, row["prompt_sha256"], written.get(sample.sample_id)))
    return records, prompts


def prompt_row(req: Request, completion: Completion) -> dict[str, Any]:
    """The prompts.jsonl row of one request: what the model saw, keyed by its hash."""
    sha = prompt_hash(completion.prompt_text, req.messages, req.tools)
    return {"prompt_sha256": sha, "messages": req.messages, "tools": req.tools,
            "rendered": completion.prompt_text, "annotations": req.annotations}


def to_record(sample: Sample, completion: Completion, ctx: RecordContext, prompt_sha: str,
              writer: dict[str, Any] | None = None) -> Record:
    graded = scenarios.grade(sample.episode, completion)  # the family's own grader
    req = sample.request
    propensity = completion.propensity
    if propensity is None and req.no_candidates:  # null, and why
        propensity = {"violate_logprob": None, "reason": req.no_candidates}
    return Record(
        sample_id=req.sample_id, episode_id=req.episode_id, scenario=sample.episode.scenario,
        family=sample.episode.family, params=sample.episode.params, condition=sample.condition,
        condition_config=asdict(sample.condition_cfg), model=ctx.model.name,
        model_path=ctx.model.weights, backend=ctx.backend,
        generation=req.generation.identity(), replicate=req.replicate, seed=req.seed, prompt_sha256=prompt_sha,
        prompt_tokens=completion.prompt_tokens, cached_prompt_tokens=completion.cached_prompt_tokens,
        completion_tokens=completion.completion_tokens, thinking_tokens=completion.thinking_tokens,
        answer_tokens=completion.answer_tokens, text=completion.text, reasoning=completion.reasoning,
        tool_calls=[asdict(c) for c in graded.calls], label=graded.label, correct=graded.correct,
        expected=sample.episode.expected, reason=graded.reason, call_format=call_format(graded.calls),
        latency_s=completion.latency_s, finish_reason=completion.finish_reason, error=completion.error,
        scripted=completion.scripted, cost_usd=cost_usd(ctx.model, completion), ttft_s=completion.ttft_s, writer=writer,
        batch_latency_s=completion.batch_latency_s,
        token_source=completion.token_source, propensity=propensity,
        thinking_tokens_source=completion.thinking_tokens_source, cache_write_tokens=completion.cache_write_tokens,
        request_id=completion.request_id, batched=completion.batched,
        created_at=manifest.now("microseconds"))  # to the microsecond: the newest record of a sample wins


def records_kept(run_dir: Path) -> int:
    """Record lines in the run and its shards (for the interruption message)."""
    kept = 0
    for part in run_parts(Path(run_dir)):
        path = part / RECORDS
        if path.is_file():
            with open(path, "rb") as fh:
                kept += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return kept

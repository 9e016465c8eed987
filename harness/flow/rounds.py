"""A run's rounds: until every rollout's environment is done, the lowest pending step of the active
rollouts, in batches: view -> write model bars -> generate -> grade -> probe -> act -> append.

A single decision on a frozen trajectory is a one-step rollout, so a run of single decisions is one
round of the same stages; every mechanism and probe runs at every step of either.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import scenarios
from harness import progress
from harness.backends import Backend
from harness.config.schemas import ModelConfig, ProbeConfig
from harness.context import ConditionConfig, view
from harness.flow.plan import Rollout
from harness.flow.probe import RunProbe
from harness.flow.stages import OpenRun, Pending, record_rollouts
from harness.flow.writer import WriterBackends, unwritten, write_bars
from harness.measure.cost import cost_usd
from harness.measure.grading import Grade, call_format
from harness.rundir import manifest
from harness.rundir.store import prompt_hash
from harness.types import Completion, Episode, Record, Request


@dataclass(frozen=True)
class RoundSettings:
    """What the rounds need of the run's config."""
    model: ModelConfig
    backend: str  # the backend's name, as records carry it
    batch_size: int  # model calls handed to the backend at once (and per records flush)
    progress: bool
    propensity: bool  # score the family's candidate next actions at every step (probe.propensity)


@dataclass
class Step:
    """One model call to make: a rollout at its next step, the history the step is graded against
    (the frozen episode itself for a single decision), the condition as the view applied it, and the request."""
    rollout: Rollout
    episode: Episode
    shown: ConditionConfig
    request: Request
    turn: int
    step: int
    step_in_turn: int

    @property
    def sample_id(self) -> str:
        return self.request.sample_id

    @property
    def condition(self) -> str:
        return self.rollout.condition

    @property
    def condition_cfg(self) -> ConditionConfig:
        return self.rollout.condition_cfg


def run_rounds(run: OpenRun, plan: list[Rollout], pending: Pending, backend: Backend, settings: RoundSettings,
               probe_cfg: ProbeConfig) -> None:
    """Rounds until every rollout of `plan` has ended (those of `pending.active` run on)."""
    from tqdm import tqdm

    run.model_info.update(backend.describe())
    writers = WriterBackends(settings.model, backend)
    if settings.propensity and not backend.scores_candidates():  # unmeasured is said, not shown as a score
        print(f"statusbench: probe.propensity: the {backend.name} backend cannot score candidates; "
              "records carry propensity null", flush=True)
    probe = RunProbe(settings.model, probe_cfg, backend, run.job_dir) if probe_cfg.attention else None
    if probe:
        run.model_info["attention_probe"] = probe.describe()
    active = pending.active
    # the backend moves the bar by fractions of a step as it computes (harness.progress.Work); the total is
    # an upper bound (every live turn at its step limit), lowered as rollouts end; miniters=0: every move redraws
    with tqdm(total=pending.steps_left(), unit="step", desc="generate", disable=not settings.progress,
              dynamic_ncols=True, miniters=0,
              bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]") as bar:
        while active:
            at = min(r.env.step for r in active)
            batch = [r for r in active if r.env.step == at][:settings.batch_size]
            records, prompts = run_batch(batch, schedule_index(plan, batch, at), backend, writers, settings, probe,
                                         bar.update)
            run.store.append(records, prompts)  # prompts first, then records (RunStore)
            record_rollouts(run, [r for r in batch if r.env.done])
            active = [r for r in active if not r.env.done]
            bar.total = bar.n + sum(r.env.steps_left() for r in active)
            bar.refresh()
    run.model_info.update(backend.describe())  # what generating told (e.g. the model a server reported)


def schedule_index(plan: list[Rollout], batch: list[Rollout], step: int) -> list[int]:
    """Where each rollout's step `step` stands in an uninterrupted run of the plan, which takes every
    rollout's step k (those that reach it, in plan order) before any step k+1: the index a scripted
    backend's match=order answers. Exact after a kill, and for a step retried (run.retry_errors) after
    the other rollouts ran on. A first step keeps its position in the whole plan (before sharding)."""
    if step == 0:
        return [r.index for r in batch]
    taken = sum(min(r.env.step, step) for r in plan)  # every step before round `step`
    wanted, out, before = {id(r) for r in batch}, {}, 0
    for r in plan:
        if id(r) in wanted:
            out[id(r)] = taken + before
        before += r.env.step > step or (r.env.step == step and not r.env.done)
    return [out[id(r)] for r in batch]


def run_batch(batch: list[Rollout], indexes: list[int], backend: Backend, writers: WriterBackends,
              settings: RoundSettings, probe: RunProbe | None,
              on_step: Callable[[float], None]) -> tuple[list[Record], list[dict[str, Any]]]:
    """One step of each rollout of the batch, through every stage; returns its records and prompt rows."""
    steps = [view_step(r, settings, i) for r, i in zip(batch, indexes)]
    steps, written = write_bars(steps, writers)  # source=model conditions whose bar shows now; {} for others
    completions = generate(backend, steps, written, on_step)
    grades = [scenarios.grade(s.episode, c) for s, c in zip(steps, completions)]  # the family's, against the history
    refs = probe.measure(steps, completions) if probe else {}
    executed = [[asdict(c) for c in s.rollout.env.act(c, g.calls)] for s, c, g in zip(steps, completions, grades)]
    prompts = [prompt_row(s.request, c) for s, c in zip(steps, completions)]
    records = [to_record(s, c, g, calls, settings, p["prompt_sha256"], written.get(s.sample_id), refs.get(s.sample_id))
               for s, c, g, calls, p in zip(steps, completions, grades, executed, prompts)]
    for s, rec in zip(steps, records):
        s.rollout.steps.append(rec)
    return records, prompts


def view_step(r: Rollout, settings: RoundSettings, index: int) -> Step:
    """What the model is shown at the rollout's next step: the condition's view of its history.
    `index`: its place in an uninterrupted run (`schedule_index`)."""
    snapshot, shown = r.env.snapshot(), r.env.shown(r.condition_cfg)
    t = view(snapshot, shown)
    candidates = scenarios.candidates(snapshot) if settings.propensity else None
    no_candidates = scenarios.no_candidates(snapshot) if settings.propensity else None
    request = Request(sample_id=r.env.step_id(r.rollout_id), episode_id=r.episode.id, condition=r.condition,
                      replicate=r.replicate, index=index,
                      messages=t.messages, tools=r.env.tools, generation=settings.model.generation,
                      seed=r.env.step_seed(r.seed), candidates=candidates, no_candidates=no_candidates,
                      annotations=t.annotations())
    return Step(r, snapshot, shown, request, r.env.turn, r.env.step, r.env.step_in_turn)


def generate(backend: Backend, steps: list[Step], written: dict[str, dict[str, Any]],
             on_step: Callable[[float], None]) -> list[Completion]:
    """One completion per step, in order; a step whose model-written bar failed is an error,
    without asking the backend."""
    failed = {s.sample_id: c for s in steps if (c := unwritten(written.get(s.sample_id, {})))}
    ready = [s for s in steps if s.sample_id not in failed]
    if failed:
        on_step(len(failed))  # done: nothing to compute
    with progress.reporting(on_step, len(ready)):
        answered = backend.generate([s.request for s in ready]) if ready else []
    if len(answered) != len(ready):
        raise RuntimeError(f"backend {backend.name} returned {len(answered)} completions for {len(ready)} requests")
    answers = iter(answered)
    return [failed.get(s.sample_id) or next(answers) for s in steps]


def prompt_row(req: Request, completion: Completion) -> dict[str, Any]:
    """The prompts.jsonl row of one request: what the model saw, keyed by its hash."""
    sha = prompt_hash(completion.prompt_text, req.messages, req.tools)
    return {"prompt_sha256": sha, "messages": req.messages, "tools": req.tools,
            "rendered": completion.prompt_text, "annotations": req.annotations}


def to_record(step: Step, completion: Completion, grade: Grade, calls: list[dict[str, Any]], settings: RoundSettings,
              prompt_sha: str, writer: dict[str, Any] | None = None, attention_ref: str | None = None) -> Record:
    r, req, c = step.rollout, step.request, completion
    propensity = c.propensity
    if propensity is None and req.no_candidates:  # null, and why
        propensity = {"violate_logprob": None, "reason": req.no_candidates}
    return Record(
        sample_id=req.sample_id, episode_id=r.episode.id, scenario=r.episode.scenario, family=r.episode.family,
        params=r.episode.params, condition=r.condition, condition_config=asdict(r.condition_cfg),
        model=settings.model.name, model_path=settings.model.weights, backend=settings.backend,
        generation=asdict(req.generation), replicate=r.replicate, seed=req.seed, prompt_sha256=prompt_sha,
        prompt_tokens=c.prompt_tokens, cached_prompt_tokens=c.cached_prompt_tokens, completion_tokens=c.completion_tokens,
        thinking_tokens=c.thinking_tokens, answer_tokens=c.answer_tokens, text=c.text, reasoning=c.reasoning,
        tool_calls=[asdict(call) for call in grade.calls], label=grade.label, correct=grade.correct,
        expected=step.episode.expected, reason=grade.reason, call_format=call_format(grade.calls),
        latency_s=c.latency_s, finish_reason=c.finish_reason, error=c.error, scripted=c.scripted,
        cost_usd=cost_usd(settings.model, c), ttft_s=c.ttft_s, writer=writer, batch_latency_s=c.batch_latency_s,
        token_source=c.token_source, propensity=propensity, attention_ref=attention_ref,
        thinking_tokens_source=c.thinking_tokens_source, cache_write_tokens=c.cache_write_tokens, request_id=c.request_id,
        batched=c.batched,
        rollout_id=r.rollout_id, turn=step.turn, step=step.step, step_in_turn=step.step_in_turn,
        context_messages=len(req.messages),
        prompt_chars=sum(len(m["content"]) for m in req.messages if isinstance(m.get("content"), str)),
        completion_tool_calls=c.tool_calls, calls=calls,
        created_at=manifest.now("microseconds"))  # to the microsecond: the newest record of a step wins

"""The rollout flow (`experiment.mode=rollouts`): plan the rollouts (episodes x conditions x
replicates) -> open the run (lock, admit: the stages' own) -> resume each rollout by replaying its
stored steps through its environment -> rounds: the next step of every active rollout in one batch
-> the environment executes, the family's grader labels, records and prompts are appended -> a
rollout's record once it ends.

Resumable at step granularity: records.jsonl holds every completion, so a rerun replays them (no
model call repeated) and continues each rollout at its next step; the environment is deterministic,
so the run ends with the records an uninterrupted run writes.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import scenarios
from harness.backends import Backend, make_backend
from harness.config.schemas import Config, require
from harness.context import ConditionConfig, view
from harness.context.history import History
from harness.flow import stages
from harness.flow.plan import in_shard, sample_seed, with_model
from harness.measure.cost import cost_usd
from harness.measure.grading import Grade
from harness.rundir import manifest
from harness.rundir.layout import ROLLOUTS
from harness.rundir.store import RunDirError, read_jsonl
from harness.types import Completion, Episode, Request, short_hash

from .env import Environment
from .records import RolloutRecord, StepRecord, executed


@dataclass
class Rollout:
    rollout_id: str
    episode: Episode
    condition: str
    ccfg: ConditionConfig
    replicate: int
    seed: int
    env: Environment
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def shown(self) -> ConditionConfig:
        """The condition as the view applies it: the loop guard is the environment's, already in the history;
        a compacted history is the whole one until the environment first compacts (rollout.compact_tokens)."""
        shown = replace(self.ccfg, loop_guard=None)
        if shown.history == History.compacted and self.env.uncompacted:
            return replace(shown, history=History.full, todo=None, ledger=None)
        return shown


def plan(cfg: Config) -> list[Rollout]:
    family = cfg.scenario.family
    scenarios.live(family)  # a step is labelled against the live history: only a family with a Live environment runs
    episodes = scenarios.build_episodes(cfg.scenario)
    cfg.check_plan_size(len(episodes))
    require(cfg.rollout.compact_tokens is None or all(e.compact_at is not None for e in episodes), "rollout.compact_tokens",
            f"the {family} family has no compaction point (no summary to compact to)")
    identity = {"model": cfg.model.identity(), "backend": cfg.backend.identity(),
                "generation": cfg.model.generation.identity(), "rollout": cfg.rollout.identity()}
    out: list[Rollout] = []
    for episode in episodes:
        for name, ccfg in cfg.conditions.items():
            ccfg = with_model(ccfg, cfg.model)
            for replicate in range(cfg.experiment.replicates):
                seed = sample_seed(cfg.experiment.seed, episode.id, replicate)
                rid = short_hash({"episode": episode.id, "condition": {"name": name, **ccfg.identity()},
                                  "replicate": replicate, "seed": seed, **identity})
                env = Environment(episode, cfg.rollout, ccfg.loop_guard)
                out.append(Rollout(rid, episode, name, ccfg, replicate, seed, env))
    shard = cfg.run.shard_spec
    return out if shard is None else [r for r in out if in_shard(r.episode.id, *shard)]


def resume(r: Rollout, stored: list[StepRecord]) -> None:
    """Replay the stored steps through the environment; refuse a history it no longer reproduces."""
    for rec in sorted(stored, key=lambda s: s.step):
        if r.env.done or rec.step != r.env.step:
            raise RunDirError(f"rollout {r.rollout_id}: stored step {rec.step} does not follow step {r.env.step - 1} "
                              "(records.jsonl was edited); use another run.name=")
        if executed(r.env.act(rec.completion())) != rec.calls:
            raise RunDirError(f"rollout {r.rollout_id} step {rec.step}: replaying the stored completion executes other "
                              "calls than recorded (the environment changed since); use another run.name=")
        r.steps.append(rec)


def execute(cfg: Config, resolved: dict[str, Any], run_dir: Path, backend: Backend | None = None) -> dict[str, int]:
    """Run every unfinished rollout of the plan into run_dir. Returns counts for the caller."""
    rollouts = plan(cfg)
    with stages.open_run(cfg, Path(run_dir), resolved) as run:
        recorded = {row["rollout_id"] for row in read_jsonl(run.job_dir / ROLLOUTS, repair=True, required=("rollout_id",))}
        stored: dict[str, list[StepRecord]] = defaultdict(list)
        for row in read_jsonl(run.store.records_path, repair=True, required=("rollout_id", "step")):
            stored[row["rollout_id"]].append(StepRecord.of(row))
        # the index a scripted backend with match=order answers: the step's place in an uninterrupted run.
        # Records are appended in that order (rounds by step, each in plan order; a resumed run first
        # completes the round a kill cut short), so the stored ones are always its first steps.
        order = itertools.count(sum(len(steps) for steps in stored.values()))
        for r in rollouts:
            resume(r, stored[r.rollout_id])
        # a rollout is done when its stored steps end it; one whose steps were cut off after its record was
        # written runs on, and its new record supersedes the old (the newest line of a rollout counts)
        unrecorded = [r for r in rollouts if r.env.done and r.rollout_id not in recorded]
        active = [r for r in rollouts if not r.env.done]
        print(f"statusbench: {len(rollouts)} rollouts planned, {len(rollouts) - len(active)} already done, "
              f"{len(active)} to run -> {run.job_dir}", flush=True)
        with nullcontext(backend) if backend or not active else make_backend(cfg.model, cfg.backend) as loaded:
            session = stages.start_session(run, len(rollouts), len(active))
            # killed after a rollout's last step but before its record: the record now
            run.store.append_rows(ROLLOUTS, [asdict(summary(cfg, r)) for r in unrecorded])
            if active:
                loaded.attach(run.job_dir)
                run.model_info.update(loaded.describe())
                step_all(cfg, run, active, order, loaded)
        session["finished_at"] = manifest.now()
        run.write_manifest(session)
    return {"planned": len(rollouts), "new": len(active)}


def step_all(cfg: Config, run: stages.OpenRun, active: list[Rollout], order: Iterator[int], backend: Backend) -> None:
    """Rounds until every rollout has ended: the lowest pending step of every rollout at it, in one batch."""
    from tqdm import tqdm

    with tqdm(unit="step", desc="rollouts", disable=not cfg.run.progress, dynamic_ncols=True) as bar:
        while active:
            step = min(r.env.step for r in active)
            batch = [r for r in active if r.env.step == step]
            records, prompts = run_round(cfg, batch, order, backend)
            run.store.append(records, prompts)  # prompts first, then records (RunStore)
            ended = [r for r in batch if r.env.done]
            run.store.append_rows(ROLLOUTS, [asdict(summary(cfg, r)) for r in ended])
            active = [r for r in active if not r.env.done]
            bar.update(len(batch))


def run_round(cfg: Config, batch: list[Rollout], order: Iterator[int], backend: Backend) -> tuple[list[StepRecord], list[dict[str, Any]]]:
    """One step of each rollout of the batch: view -> generate (one call) -> grade -> execute."""
    snapshots = [r.env.snapshot() for r in batch]
    requests = [request(cfg, r, snap, order) for r, snap in zip(batch, snapshots)]
    completions = backend.generate(requests)
    if len(completions) != len(batch):
        raise RuntimeError(f"backend {backend.name} returned {len(completions)} completions for {len(batch)} requests")
    records, prompts = [], []
    for r, snap, req, completion in zip(batch, snapshots, requests, completions):
        grade = scenarios.grade(snap, completion)  # the family's grader, against the history before the step
        row = stages.prompt_row(req, completion)
        turn, step_in_turn = r.env.turn, r.env.step_in_turn
        calls = executed(r.env.act(completion))
        rec = step_record(cfg, r, req, completion, row["prompt_sha256"], grade, snap.expected, calls, turn, step_in_turn)
        r.steps.append(rec)
        records.append(rec)
        prompts.append(row)
    return records, prompts


def request(cfg: Config, r: Rollout, snap: Episode, order: Iterator[int]) -> Request:
    shown = view(snap, r.shown)
    r.env.mark_guard(shown)
    step = r.env.step
    return Request(sample_id=short_hash({"rollout": r.rollout_id, "step": step}), episode_id=r.episode.id,
                   condition=r.condition, replicate=r.replicate, index=next(order),
                   messages=shown.messages, tools=r.env.tools, generation=cfg.model.generation,
                   seed=int(short_hash({"seed": r.seed, "step": step}, 8), 16), annotations=shown.annotations())


def step_record(cfg: Config, r: Rollout, req: Request, c: Completion, prompt_sha: str, grade: Grade, expected: str,
                calls: list[dict[str, Any]], turn: int, step_in_turn: int) -> StepRecord:
    return StepRecord(
        sample_id=req.sample_id, rollout_id=r.rollout_id, episode_id=r.episode.id, scenario=r.episode.scenario,
        family=r.episode.family, condition=r.condition, replicate=r.replicate, seed=req.seed, turn=turn,
        step=r.env.step - 1, step_in_turn=step_in_turn, model=cfg.model.name, backend=cfg.backend.name,
        prompt_sha256=prompt_sha, context_messages=len(req.messages),
        prompt_chars=sum(len(m["content"]) for m in req.messages if isinstance(m.get("content"), str)),
        prompt_tokens=c.prompt_tokens, cached_prompt_tokens=c.cached_prompt_tokens,
        completion_tokens=c.completion_tokens, thinking_tokens=c.thinking_tokens, answer_tokens=c.answer_tokens,
        text=c.text, reasoning=c.reasoning, tool_calls=c.tool_calls, calls=calls, label=grade.label, reason=grade.reason, expected=expected,
        latency_s=c.latency_s, finish_reason=c.finish_reason, error=c.error, scripted=c.scripted,
        cost_usd=cost_usd(cfg.model, c), token_source=c.token_source, created_at=manifest.now("microseconds"),
        thinking_tokens_source=c.thinking_tokens_source, cache_write_tokens=c.cache_write_tokens, request_id=c.request_id)


def summary(cfg: Config, r: Rollout) -> RolloutRecord:
    head = {"rollout_id": r.rollout_id, "episode_id": r.episode.id, "scenario": r.episode.scenario,
            "family": r.episode.family, "params": r.episode.params, "condition": r.condition,
            "condition_config": asdict(r.ccfg), "replicate": r.replicate, "model": cfg.model.name,
            "backend": cfg.backend.name}
    return RolloutRecord.summarize(head, r.steps, str(r.env.outcome), r.env.turn + 1,
                                   r.env.target_calls() - r.env.opening_calls, manifest.now("microseconds"))


"""What a rollout run writes: one StepRecord per model call (records.jsonl, its prompt in
prompts.jsonl) and one RolloutRecord per finished rollout (rollouts.jsonl)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from harness.types import RECORD_SCHEMA_VERSION, Completion

from .env import ExecutedCall


@dataclass
class StepRecord:
    sample_id: str  # the step's own id (rollout id and step), as every record of a run has one
    rollout_id: str
    episode_id: str
    scenario: str
    family: str
    condition: str
    replicate: int
    seed: int
    turn: int  # 0: the episode's own user turn; each press of the user starts the next
    step: int  # model calls of the rollout before this one
    step_in_turn: int
    model: str
    backend: str
    prompt_sha256: str
    context_messages: int  # messages in the prompt
    prompt_chars: int  # characters of the prompt's message contents: context length where no tokens are counted
    prompt_tokens: int | None
    cached_prompt_tokens: int | None  # as the engine or API reported them; null where it reports none
    completion_tokens: int | None
    thinking_tokens: int | None
    answer_tokens: int | None
    text: str  # the completion as generated: replayed on resume
    reasoning: str
    tool_calls: list[dict[str, Any]]  # API-style calls the backend returned
    calls: list[dict[str, Any]]  # the calls the environment executed, with their results
    label: str
    reason: str  # the grader's
    expected: str
    latency_s: float | None
    finish_reason: str | None
    error: str | None
    scripted: bool
    cost_usd: float | None
    token_source: str | None
    created_at: str
    schema_version: int = RECORD_SCHEMA_VERSION
    thinking_tokens_source: str | None = None  # see harness.types.Completion
    cache_write_tokens: int | None = None
    request_id: str | None = None

    def completion(self) -> Completion:
        """What the backend returned, as the environment needs it to replay this step."""
        return Completion(text=self.text, reasoning=self.reasoning, tool_calls=self.tool_calls,
                          finish_reason=self.finish_reason, error=self.error, scripted=self.scripted)

    @classmethod
    def of(cls, row: dict[str, Any]) -> StepRecord:
        return cls(**{k: row.get(k) for k in cls.__dataclass_fields__})


def executed(calls: list[ExecutedCall]) -> list[dict[str, Any]]:
    return [asdict(c) for c in calls]


def _total(values: Iterable[Any]) -> Any:
    """A sum, or None when any part is unknown (an unknown count or cost is not a zero)."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


@dataclass
class RolloutRecord:
    rollout_id: str
    episode_id: str
    scenario: str
    family: str
    params: dict[str, Any]
    condition: str
    condition_config: dict[str, Any]
    replicate: int
    model: str
    backend: str
    outcome: str  # harness.agent.env: finished, halted, step_limit, error
    steps: int
    turns: int  # user turns taken, the opening one included
    violations: int  # steps labelled violated
    first_violation_step: int | None
    first_violation_turn: int | None
    target_calls: int  # executed calls naming the target, blocked ones included
    blocked_calls: int
    failed_calls: int
    prompt_tokens: int | None
    cached_prompt_tokens: int | None  # null when the backend reported none
    completion_tokens: int | None
    thinking_tokens: int | None
    cost_usd: float | None
    scripted: bool
    created_at: str
    schema_version: int = RECORD_SCHEMA_VERSION

    @classmethod
    def summarize(cls, head: dict[str, Any], steps: list[StepRecord], outcome: str, turns: int, target_calls: int,
                  created_at: str) -> RolloutRecord:
        """`head`: the rollout's identity fields; `steps`: its step records in order."""
        violated = [s for s in steps if s.label == "violated"]
        calls = [c for s in steps for c in s.calls]
        cached = [s.cached_prompt_tokens for s in steps if s.cached_prompt_tokens is not None]
        return cls(**head, outcome=outcome, steps=len(steps), turns=turns, violations=len(violated),
                   first_violation_step=violated[0].step if violated else None,
                   first_violation_turn=violated[0].turn if violated else None,
                   target_calls=target_calls,
                   blocked_calls=sum(c["blocked"] for c in calls), failed_calls=sum(c["failed"] for c in calls),
                   prompt_tokens=_total(s.prompt_tokens for s in steps),
                   cached_prompt_tokens=sum(cached) if cached else None,
                   completion_tokens=_total(s.completion_tokens for s in steps),
                   thinking_tokens=_total(s.thinking_tokens for s in steps),
                   cost_usd=_total(s.cost_usd for s in steps), scripted=any(s.scripted for s in steps),
                   created_at=created_at)

"""Typed data that flows through a run: episodes, requests, completions, records."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Optional

from harness.errors import require

Message = dict[str, Any]  # OpenAI chat format: role, content, tool_calls, tool_call_id, name

# 2: one record per model call for every run (the rollout fields); version 1 is still read (harness.rundir.records)
RECORD_SCHEMA_VERSION = 2


def json_default(obj: Any) -> str:
    # an Enum by its name, as the config spells it (a Wrapper's value is a template, its str the class path)
    return obj.name if isinstance(obj, Enum) else str(obj)


def canonical_json(obj: Any) -> str:
    """One byte string per value: sorted keys, no whitespace, unicode kept, strict JSON (a NaN or
    infinity raises instead of writing a line other JSON readers refuse)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=json_default)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def short_hash(obj: Any, n: int = 16) -> str:
    return sha256(canonical_json(obj))[:n]


@dataclass(frozen=True)
class Rule:
    """A limit on calls of one tool per value of one argument (e.g. phone_call per company)."""

    tool: str
    arg: str
    limit: int


@dataclass
class Episode:
    id: str
    scenario: str
    family: str
    params: dict[str, Any]
    messages: list[Message]
    tools: list[dict[str, Any]]
    # a call-limit family's limit and the argument value it counts; None for every other kind of
    # decision (scenarios.family.Decision), whose right answer lives in `facts`
    rule: Rule | None
    target: str | None
    # ground truth a status bar would distil, counted while the trajectory was built
    facts: dict[str, Any]
    # the label a right decision gets: for a call limit "refused" at/over the limit, "complied" below it (control cells)
    expected: str
    # one tag per message (system, request, call_record, distractor, assistant, question)
    tags: list[str] = field(default_factory=list)
    # which facts the family's status bar shows: calls, todo, repeats, failures (harness.context.status)
    status_facts: list[str] = field(default_factory=lambda: ["calls"])
    # index of the first message kept when a condition compacts the history or opens a new cycle
    # (None: the family has no compaction point), and the summary that replaces what came before
    compact_at: int | None = None
    compaction_summary: str = ""
    workspace: str = "/workspace"
    # the workspace's listing, relative paths, a directory ending in "/": <turn_meta>'s key files and directories
    workspace_files: list[str] = field(default_factory=list)
    # the first message the loop guard's texts are shown on: 0 for a frozen trajectory; a rollout's
    # environment guards only the calls made live (its opening is shown as it was)
    guarded_from: int = 0


# every effort level a provider names (OpenAI's reasoning.effort, Anthropic's output_config.effort);
# which a model takes is the API's to say (a 400 names it)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
THINKING_CONTROLS = ("reasoning_effort", "thinking_budget")
# where a thinking count comes from (Completion.thinking_tokens_source)
THINKING_SOURCES = ("api", "counted", "estimated")


@dataclass
class GenerationSettings:
    """Provider-neutral decoding settings (the schema of `model.generation`); temperature 0 means greedy."""

    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    # how hard a reasoning model thinks, as its API names the level (OpenAI: none..xhigh; Anthropic: low..max);
    # null: the API's default. Sent as the model preset's thinking_control says (harness.config.schemas)
    reasoning_effort: Optional[str] = None
    # a thinking budget in tokens, for APIs that take one (Anthropic's manual extended thinking); null: none sent
    thinking_budget: Optional[int] = None

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, "model.generation.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        require(self.temperature >= 0, "model.generation.temperature", f"must be >= 0, got {self.temperature}")
        require(0 < self.top_p <= 1, "model.generation.top_p", f"must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, "model.generation.top_k", f"must be >= 0, got {self.top_k}")
        require(0 <= self.min_p < 1, "model.generation.min_p", f"must be in [0, 1), got {self.min_p}")
        require(self.reasoning_effort is None or self.reasoning_effort in EFFORTS, "model.generation.reasoning_effort",
                f"must be one of {', '.join(EFFORTS)} or null, got {self.reasoning_effort!r}")
        require(self.thinking_budget is None or self.thinking_budget >= 1, "model.generation.thinking_budget",
                f"must be >= 1 or null, got {self.thinking_budget}")

    def identity(self) -> dict[str, Any]:
        """The settings as sample ids and run fingerprints hash them: the thinking controls only when
        set, so every id from before they existed stays as it was."""
        return {k: v for k, v in asdict(self).items() if k not in THINKING_CONTROLS or v is not None}

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Request:
    sample_id: str
    episode_id: str
    condition: str
    replicate: int
    index: int  # position in the run's plan, for order-matched scripted replay
    messages: list[Message]
    tools: list[dict[str, Any]]
    generation: GenerationSettings
    seed: int
    candidates: list[Any] | None = None  # harness.measure.propensity.Candidate to score when probe.propensity is on
    no_candidates: str | None = None  # probe.propensity on, and why the family has no candidates to score
    # per message: the episode message it shows and the regions mechanisms marked in it (harness.context.transcript)
    annotations: list[dict[str, Any]] | None = None


@dataclass
class Completion:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # API-style, if the backend returned any
    prompt_text: str | None = None  # exactly what the model saw, when the backend rendered it
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    thinking_tokens: int | None = None
    answer_tokens: int | None = None
    latency_s: float | None = None  # this sample's own time (a request's, or its share of a decode batch)
    finish_reason: str | None = None
    error: str | None = None
    scripted: bool = False
    ttft_s: float | None = None  # time to first token, when the backend streamed
    batch_latency_s: float | None = None  # wall time of the backend call or decode batch the sample was part of
    # who counted the tokens when the generating backend did not (scripted: "usage", or the tokenizer used)
    token_source: str | None = None
    propensity: dict[str, Any] | None = None  # candidate scores (harness.measure.propensity.summarize)
    # the generated token ids, where the backend has them: the attention probe replays these, not a
    # re-tokenization of the decoded text (which can split differently); not stored in records
    token_ids: list[int] | None = None
    # where thinking_tokens came from: "api" (the server's usage), "counted" (the model's own token ids),
    # "estimated" (visible text re-tokenized); None where the count is unknown
    thinking_tokens_source: str | None = None
    cache_write_tokens: int | None = None  # prompt tokens written to a provider's cache (billed apart)
    request_id: str | None = None  # the provider's id of the request (for support and billing questions)
    batched: bool = False  # answered through a provider's batch API: billed at its batch prices


@dataclass
class Arm:
    """What names a rollout's episode and arm, in its records and its rollout record alike."""
    episode_id: str
    scenario: str
    family: str
    params: dict[str, Any]
    condition: str
    condition_config: dict[str, Any]
    replicate: int
    model: str
    backend: str


@dataclass
class Record(Arm):
    """One model call. A single decision on a frozen trajectory is step 0 of a one-step rollout (its
    `rollout_id` is its `sample_id`); a rollout's steps each have one, graded against the live history."""
    sample_id: str
    model_path: str | None
    generation: dict[str, Any]
    seed: int
    prompt_sha256: str
    prompt_tokens: int | None
    cached_prompt_tokens: int | None
    completion_tokens: int | None
    thinking_tokens: int | None
    answer_tokens: int | None
    text: str
    reasoning: str
    tool_calls: list[dict[str, Any]]  # the calls the grader parsed (harness.measure.grading.ParsedCall)
    label: str
    correct: bool
    expected: str
    latency_s: float | None
    finish_reason: str | None
    error: str | None
    scripted: bool
    created_at: str
    schema_version: int = RECORD_SCHEMA_VERSION
    cost_usd: float | None = None  # from the model's prices and this sample's token counts
    ttft_s: float | None = None
    # "attention/part-<n>.npz#<sample_id>" in the run directory when the attention probe measured this sample
    attention_ref: str | None = None
    # condition source=model: the writer's bar, tokens, latency, cost and text (harness.flow.writer)
    writer: dict[str, Any] | None = None
    token_source: str | None = None  # see Completion.token_source
    # why the grader chose the label (harness.measure.grading), and the format of the calls it read
    # (hermes, json_fence, bare_json, native, mixed; None without a call)
    reason: str | None = None
    call_format: str | None = None
    # probe.propensity: log-probabilities of the scenario's candidate next actions (harness.measure.propensity)
    propensity: dict[str, Any] | None = None
    batch_latency_s: float | None = None  # see Completion.batch_latency_s
    thinking_tokens_source: str | None = None  # see Completion.thinking_tokens_source
    cache_write_tokens: int | None = None  # see Completion.cache_write_tokens
    request_id: str | None = None  # see Completion.request_id
    batched: bool = False  # see Completion.batched
    # the rollout this call is a step of (schema 2): one record per model call in every run
    rollout_id: str = ""
    turn: int = 0  # 0: the episode's own user turn; each press of the user starts the next
    step: int = 0  # model calls of the rollout before this one
    step_in_turn: int = 0
    context_messages: int | None = None  # messages in the prompt (null in records of schema 1)
    prompt_chars: int | None = None  # characters of the prompt's message contents: context length where no tokens are counted
    completion_tool_calls: list[dict[str, Any]] = field(default_factory=list)  # API-style calls the backend returned
    calls: list[dict[str, Any]] = field(default_factory=list)  # what the environment executed, with results

    def completion(self) -> Completion:
        """What the backend returned, as far as grading and the environment read it (a resumed step replays it)."""
        return Completion(text=self.text, reasoning=self.reasoning, tool_calls=self.completion_tool_calls,
                          finish_reason=self.finish_reason, error=self.error, scripted=self.scripted)


def _total(values: list[Any]) -> Any:
    """A sum, or None when any part is unknown (an unknown count or cost is not a zero)."""
    return None if any(v is None for v in values) else sum(values)


@dataclass
class RolloutRecord(Arm):
    """One per rollout (rollouts.jsonl), a single decision's one-step rollout included."""
    rollout_id: str
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
    def summarize(cls, steps: list[Record], outcome: str, turns: int, target_calls: int, created_at: str) -> RolloutRecord:
        """`steps`: the rollout's records in order (the first names the rollout)."""
        head = steps[0]
        violated = [s for s in steps if s.label == "violated"]
        calls = [c for s in steps for c in s.calls]
        cached = [s.cached_prompt_tokens for s in steps if s.cached_prompt_tokens is not None]
        return cls(**{f.name: getattr(head, f.name) for f in fields(Arm)}, rollout_id=head.rollout_id, outcome=outcome, steps=len(steps), turns=turns, violations=len(violated),
                   first_violation_step=violated[0].step if violated else None,
                   first_violation_turn=violated[0].turn if violated else None,
                   target_calls=target_calls,
                   blocked_calls=sum(c["blocked"] for c in calls), failed_calls=sum(c["failed"] for c in calls),
                   prompt_tokens=_total([s.prompt_tokens for s in steps]),
                   cached_prompt_tokens=sum(cached) if cached else None,
                   completion_tokens=_total([s.completion_tokens for s in steps]),
                   thinking_tokens=_total([s.thinking_tokens for s in steps]),
                   cost_usd=_total([s.cost_usd for s in steps]), scripted=any(s.scripted for s in steps),
                   created_at=created_at)

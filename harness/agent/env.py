"""The environment a rollout acts in: an episode's trajectory as its opening, tools whose calls
execute against deterministic simulators, the seed's loop guard in front of them, a scripted user
who presses after each answer, a turn budget and a stop rule.

The history it keeps is the engine's truth: the assistant's calls as structured `tool_calls` (the
calls the grader parsed: the step's text is parsed once), each call's result as the tool returned it
(the guard's block message for a blocked call, which never ran). Every condition shows the model a
view of this history (harness.context.view on `snapshot()`); the guard is the environment's (on
under every condition, as in the seed's engine; a condition's `loop_guard` settings set its
thresholds), and the view's guard step writes its texts (the block message, the warn or halt line
after a failing result) on the calls made live, exactly as the live guard decided them.

The family's `Live` (scenarios.family) answers its own tools' calls and recounts what its grader
reads from the history; the seed's TODO kit runs on the environment's one list. With
`rollout.compact_tokens`, a user turn that starts with more than about that many tokens kept since the
last compaction compacts everything before it: a compacted-history condition (`todo_compaction`,
`todo_cycle`, `compacted`) shows the bridge (the summary and the reinjected TODO, or the `[CYCLE STATE]`
seed and its ack) and the turns since; before the first compaction it shows the whole history.

Stop rule: a step without a call is an answer to the user, which ends the turn; the user presses
again until `turns` user turns have been taken or the family's task is done. A rollout also ends
when the guard halts (8 failures in a row), when a turn reaches `max_steps_per_turn` model calls, or
on a backend error.

A single decision on a frozen trajectory is the same loop's simplest case: `Frozen`, an environment
of one step whose act executes nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from harness.config.schemas import RolloutConfig
from harness.context import todo
from harness.context.ledger import estimate_tokens
from harness.context import ConditionConfig
from harness.context.history import History
from harness.context.loop_guard import LoopGuard, LoopGuardConfig, is_failure
from harness.context.status import tally
from harness.measure.grading import ParsedCall
from harness.render import split_thinking, without_tool_calls
from harness.types import Completion, Episode, Message, short_hash
from scenarios.family import live

UNKNOWN_TOOL = "Error: unknown tool {name}"

# why a rollout ended
FINISHED, HALTED, STEP_LIMIT, ERROR = "finished", "halted", "step_limit", "error"


def _todo_tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


_STATUS = {"type": "string", "enum": [s.value for s in todo.TodoStatus]}
_CANONICAL = {
    "checklist_write": ("The complete list of todo items. This replaces the existing list.",
                        {"todos": {"type": "array", "items": {"type": "object", "properties": {
                            "content": {"type": "string"}, "status": _STATUS}}}}),
    "checklist_add": ("Add one item to the checklist.", {"content": {"type": "string"}}),
    "checklist_update": ("Set the status of one checklist item.", {"id": {"type": "integer"}, "status": _STATUS}),
    "checklist_list": ("Show the current checklist.", {}),
}
# the seed's eight names (registry.rs:661-671): the aliases take the canonical tool's parameters
TODO_TOOLS = [_todo_tool(name, desc, props) for name, (desc, props) in _CANONICAL.items()] + [
    _todo_tool(name.replace("checklist_", "todo_"), f"Compatibility alias for {name}.", props)
    for name, (_, props) in _CANONICAL.items()]


def executable(calls: list[ParsedCall]) -> list[ParsedCall]:
    """The calls a step executes: a malformed call (no name, arguments that are not JSON) cannot run."""
    return [c for c in calls if not c.malformed and c.name]


@dataclass(frozen=True)
class ExecutedCall:
    id: str
    name: str
    arguments: dict[str, Any]
    result: str  # the tool result the model is shown (the guard's line after it, where it wrote one)
    blocked: bool  # answered by the guard's block message, not executed
    failed: bool  # a failure for the guard's streak


class Frozen:
    """A frozen trajectory as an environment: one step, graded against the episode as built, whose
    act executes nothing. Its step keeps the id and seed a single decision always had."""

    def __init__(self, episode: Episode):
        self.episode = episode
        self.tools = episode.tools
        self.turn = self.step = self.step_in_turn = 0
        self.outcome: str | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def snapshot(self) -> Episode:
        return self.episode

    def shown(self, ccfg: ConditionConfig) -> ConditionConfig:
        return ccfg

    def step_id(self, rollout_id: str) -> str:
        return rollout_id

    def step_seed(self, seed: int) -> int:
        return seed

    def act(self, completion: Completion, calls: list[ParsedCall]) -> list[ExecutedCall]:
        self.step = self.step_in_turn = 1
        self.outcome = ERROR if completion.error else FINISHED
        return []

    def new_target_calls(self) -> int:
        return 0

    def steps_left(self) -> int:
        return 0 if self.done else 1


class Environment:
    def __init__(self, episode: Episode, cfg: RolloutConfig, guard: LoopGuardConfig | None = None):
        self.episode = episode
        self.cfg = cfg
        self.live = live(episode.family)
        self.messages: list[Message] = [dict(m) for m in episode.messages]
        self.todo_kit = cfg.todo_tools or self.live.todo
        named = {t["function"]["name"] for t in episode.tools}  # a family's own TODO tools are not offered twice
        self.tools = list(episode.tools) + ([t for t in TODO_TOOLS if t["function"]["name"] not in named] if self.todo_kit else [])
        self.todos = todo.replay(self.messages)  # the list the opening trajectory left, shared by all eight names
        # where a compacted history starts: the family's own point, or none until rollout.compact_tokens is passed
        self.compact_at = episode.compact_at if cfg.compact_tokens is None else None
        # the opening ends with the user's message, which starts the guard's first turn
        self.guard = LoopGuard(guard or LoopGuardConfig())
        streak = tally(self.messages, None).failure_streak
        self.guard.failures = streak[1] if streak else 0  # the streak spans turns: the opening's last failures count
        users = [m for m in episode.messages if m["role"] == "user"]
        self.press = cfg.user_press if cfg.user_press is not None else (users[-1]["content"] if users else "")
        self.turn = 0
        self.step = 0
        self.step_in_turn = 0
        self.outcome: str | None = None
        self.opening_calls = self.target_calls()  # calls to the target the opening trajectory made
        self._turn_starts()

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def uncompacted(self) -> bool:
        """Compaction is the environment's (rollout.compact_tokens) and has not happened yet."""
        return self.cfg.compact_tokens is not None and self.compact_at is None

    def target_calls(self) -> int:
        """Calls so far of the rule's tool naming the target (the bar's and the grader's matcher)."""
        return tally(self.messages, self.episode.rule, self.episode.target).calls_by_target.get(self.episode.target, 0)

    def new_target_calls(self) -> int:
        """Calls naming the target the rollout made (the opening's left out)."""
        return self.target_calls() - self.opening_calls

    def steps_left(self) -> int:
        """An upper bound of the model calls still to come: every turn left at the step limit."""
        if self.done:
            return 0
        per_turn = self.cfg.max_steps_per_turn
        return (self.cfg.turns - self.turn - 1) * per_turn + per_turn - self.step_in_turn

    def step_id(self, rollout_id: str) -> str:
        return short_hash({"rollout": rollout_id, "step": self.step})

    def step_seed(self, seed: int) -> int:
        return int(short_hash({"seed": seed, "step": self.step}, 8), 16)

    def shown(self, ccfg: ConditionConfig) -> ConditionConfig:
        """The condition as the view applies it to this history: the guard is the environment's (its
        texts shown on the calls made live); a compacted history is the whole one until the environment
        first compacts (rollout.compact_tokens)."""
        shown = replace(ccfg, loop_guard=self.guard.cfg)
        if shown.history == History.compacted and self.uncompacted:
            return replace(shown, history=History.full, todo=None, ledger=None)
        return shown

    def snapshot(self) -> Episode:
        """The history so far as an episode: what a condition's view is built from and the step is
        graded against (its facts and expected label recounted by the family's `judge`)."""
        # one tag per message where the family tags its messages (attention regions): the steps' are `rollout`
        added = len(self.messages) - len(self.episode.messages)
        tags = self.episode.tags + ["rollout"] * added if self.episode.tags else []
        return self.live.judge(replace(self.episode, messages=list(self.messages), tags=tags, compact_at=self.compact_at,
                                       guarded_from=len(self.episode.messages)))

    def act(self, completion: Completion, calls: list[ParsedCall]) -> list[ExecutedCall]:
        """Apply one model call: its answer joins the history, `calls` (the grader's, parsed once) execute
        (a malformed one cannot run: the step reads as its text), the user presses after an answer; sets
        `outcome` when the rollout ends."""
        self.step += 1
        self.step_in_turn += 1
        if completion.error:
            self.outcome = ERROR
            return []
        _, answer = split_thinking(completion.text)
        parsed = executable(calls)
        first = 1 + sum(len(m.get("tool_calls") or []) for m in self.messages)
        ids = [f"call{first + k:05d}" for k in range(len(parsed))]  # nine alphanumerics, as the families' calls
        message: Message = {"role": "assistant", "content": without_tool_calls(answer).strip()}
        if parsed:
            # keys sorted: the history is the same whether the calls come from the model's text or from a
            # record (stored as canonical JSON) replayed on resume; chat templates' tojson sorts them anyway
            message["tool_calls"] = [{"id": i, "type": "function",
                                      "function": {"name": c.name, "arguments": json.dumps(c.arguments, sort_keys=True)}}
                                     for i, c in zip(ids, parsed)]
        self.messages.append(message)
        outcomes = [self._execute(i, c) for i, c in zip(ids, parsed)]
        for c, raw in outcomes:  # the tool's own result: the view's guard step writes the guard's line after it
            self.messages.append({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": raw})
        executed = [c for c, _ in outcomes]
        if parsed and self.guard.failures >= self.guard.cfg.halt_at:  # this step's calls reached it, not the opening
            self.outcome = HALTED
        elif not parsed:
            self._answered()
        elif self.step_in_turn >= self.cfg.max_steps_per_turn:
            self.outcome = STEP_LIMIT
        return executed

    def _answered(self) -> None:
        task_done = self.live.done is not None and self.live.done(replace(self.episode, messages=self.messages))
        if self.turn + 1 >= self.cfg.turns or task_done:
            self.outcome = FINISHED
            return
        self.messages.append({"role": "user", "content": self.press})
        self.guard.new_turn()
        self.turn += 1
        self.step_in_turn = 0
        self._turn_starts()

    def _turn_starts(self) -> None:
        """A user turn starts (the last message is the user's): past rollout.compact_tokens (estimated) of
        history kept since the last compaction, everything before this turn is compacted. At a turn's
        start, as the seed's cycle boundary, so the turn under way stays whole."""
        limit = self.cfg.compact_tokens
        if limit is not None and estimate_tokens(self.messages[self.compact_at or 0:]) > limit:
            self.compact_at = len(self.messages) - 1

    def _execute(self, call_id: str, call: ParsedCall) -> tuple[ExecutedCall, str]:
        """The call's outcome, and the result the history holds (the tool's own, without the guard's line)."""
        name = str(call.name)
        blocked = self.guard.check(name, call.arguments)
        if blocked is not None:  # the seed's block message is the call's result; the call does not run
            return ExecutedCall(call_id, name, call.arguments, blocked, True, False), blocked
        result = self._simulate(name, call.arguments)
        failed = is_failure(result)
        note = self.guard.record(failed)
        shown = f"{result}\n\n{note}" if note else result  # Transcript.extend's separator, as the view's guard step writes it
        return ExecutedCall(call_id, name, call.arguments, shown, False, failed), result

    def _simulate(self, name: str, args: dict[str, Any]) -> str:
        result = self.live.simulate(self.episode, name, args)
        if result is not None:
            return result
        if name in todo.TOOL_NAMES and self.todo_kit:
            try:
                return todo.execute(self.todos, name, args)
            except (KeyError, ValueError, TypeError, AttributeError) as exc:  # the engine's error result; the list is unchanged
                return f"Error: {name}: {exc}"
        return UNKNOWN_TOOL.format(name=name)

"""The environment a rollout acts in: an episode's trajectory as its opening, tools whose calls
execute against deterministic simulators, the seed's loop guard in front of them, a scripted user
who presses after each answer, a turn budget and a stop rule.

The history it keeps is the engine's truth: the assistant's calls as structured `tool_calls`, each
call's result as the engine returned it (the guard's block message for a blocked call, its warn or
halt line appended to a failing result, as the seed's engine does). Every condition shows the model
a view of this history (harness.context.view on `snapshot()`); the guard is the environment's (on
under every condition, as in the seed's engine; a condition's `loop_guard` settings set its thresholds), so
the view does not replay it a second time, and `mark_guard` marks its text in the view instead.

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
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from harness.config.schemas import RolloutConfig
from harness.context import todo
from harness.context.ledger import estimate_tokens
from harness.context.loop_guard import REGION as GUARD_REGION
from harness.context.loop_guard import LoopGuard, LoopGuardConfig, is_failure
from harness.context.status import tally
from harness.context.transcript import Transcript
from harness.measure.grading import ParsedCall, parse_tool_calls
from harness.render import split_thinking, without_tool_calls
from harness.types import Completion, Episode, Message
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


@dataclass(frozen=True)
class ExecutedCall:
    id: str
    name: str
    arguments: dict[str, Any]
    result: str  # the tool result the history holds
    blocked: bool  # answered by the guard's block message, not executed
    failed: bool  # a failure for the guard's streak


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
        self.guard_text: dict[int, tuple[str, str]] = {}  # history index -> (the result, what the guard wrote after it)
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

    def snapshot(self) -> Episode:
        """The history so far as an episode: what a condition's view is built from and the step is
        graded against (its facts and expected label recounted by the family's `judge`)."""
        # one tag per message where the family tags its messages (attention regions): the steps' are `rollout`
        added = len(self.messages) - len(self.episode.messages)
        tags = self.episode.tags + ["rollout"] * added if self.episode.tags else []
        return self.live.judge(replace(self.episode, messages=list(self.messages), tags=tags, compact_at=self.compact_at))

    def act(self, completion: Completion) -> list[ExecutedCall]:
        """Apply one model call: its answer joins the history, its calls execute, the user presses
        after an answer; sets `outcome` when the rollout ends."""
        self.step += 1
        self.step_in_turn += 1
        if completion.error:
            self.outcome = ERROR
            return []
        _, answer = split_thinking(completion.text)
        # a malformed call (no name, arguments that are not JSON) cannot run; the step reads as its text. The
        # grader's reading: python syntax of the episode's tools, a call cut by the token limit read as far as written
        parsed = [c for c in parse_tool_calls(answer, completion.tool_calls, self.episode.tools, completion.finish_reason == "length")
                  if not c.malformed and c.name]
        first = 1 + sum(len(m.get("tool_calls") or []) for m in self.messages)
        ids = [f"call{first + k:05d}" for k in range(len(parsed))]  # nine alphanumerics, as the families' calls
        message: Message = {"role": "assistant", "content": without_tool_calls(answer).strip()}
        if parsed:
            message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                     for i, c in zip(ids, parsed)]
        self.messages.append(message)
        outcomes = [self._execute(i, c) for i, c in zip(ids, parsed)]
        for c, guard in outcomes:
            if guard is not None:
                self.guard_text[len(self.messages)] = guard
            self.messages.append({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": c.result})
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

    def mark_guard(self, t: Transcript) -> None:
        """Mark the guard's text in a view of this history (region `loop_guard`, as the condition step
        marks it in a frozen trajectory), where the view shows the tool result unchanged."""
        for i, origin in enumerate(t.origins):
            if origin in self.guard_text and t.messages[i].get("content") == self.messages[origin]["content"]:
                result, guard = self.guard_text[origin]
                if result:  # a warn or halt line after the result, the separator marked as added
                    t.replace(i, result)
                    t.extend(i, guard, GUARD_REGION)
                else:  # a blocked call: the block message is the whole result
                    t.replace(i, guard, GUARD_REGION)

    def _execute(self, call_id: str, call: ParsedCall) -> tuple[ExecutedCall, tuple[str, str] | None]:
        """The call's outcome, and (the result, the guard's text after it) where the guard wrote."""
        name = str(call.name)
        blocked = self.guard.check(name, call.arguments)
        if blocked is not None:  # the seed's block message is the call's result; the call does not run
            return ExecutedCall(call_id, name, call.arguments, blocked, True, False), ("", blocked)
        result = self._simulate(name, call.arguments)
        failed = is_failure(result)
        note = self.guard.record(failed)
        shown = f"{result}\n\n{note}" if note else result  # Transcript.extend's separator, as the condition step writes it
        return ExecutedCall(call_id, name, call.arguments, shown, False, failed), ((result, note) if note else None)

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

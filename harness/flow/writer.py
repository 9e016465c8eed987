"""Source = model: a two-stage run. A writer backend reads the history and writes the bar; then
the main model answers with that bar placed as the condition says.

The writer is the run's own backend and model unless the condition's `writer_overrides` compose
another (Hydra overrides on the run's config, e.g. `[model=qwen3-0.6b]` or a scripted backend). Its
tokens, latency and cost go into the record's `writer` field; its completion is never graded.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from harness.backends import Backend, make_backend
from harness.config.compose import to_typed
from harness.config.schemas import ModelConfig
from harness.context import view
from harness.context.bar import BarSource, shows_now, wrap
from harness.measure.cost import cost_usd
from harness.render import split_thinking
from harness.types import Completion, Message, Request

WRITER_PROMPT = (
    "You maintain the status bar of an AI agent. Read the agent's trajectory below and write the facts a "
    "careful engineer would count from its tool calls: how many times each tool was called, per target, "
    "against any limit in the policy; the current step of any checklist; repeated or failing calls. "
    "Reply with one <agent_status>...</agent_status> block and nothing else.")
_BLOCK = re.compile(r"<agent_status[^>]*>(.*?)</agent_status>", re.DOTALL)


def transcript(messages: list[Message]) -> str:
    """The history as plain text, tool calls and results included."""
    lines = []
    for m in messages:
        for call in m.get("tool_calls") or []:
            lines.append(f"[assistant called {call['function']['name']}({call['function'].get('arguments', '')})]")
        if m.get("content"):
            who = f"tool {m.get('name', '')}".strip() if m["role"] == "tool" else m["role"]
            lines.append(f"[{who}] {m['content']}")
    return "\n".join(lines)


def writer_request(step: Any) -> Request:
    req, ccfg = step.request, step.condition_cfg.status
    return replace(req, condition=f"{req.condition}:writer", tools=[],
                   messages=[{"role": "system", "content": WRITER_PROMPT},
                             {"role": "user", "content": transcript(step.episode.messages)}],
                   generation=replace(req.generation, max_new_tokens=ccfg.writer_max_new_tokens))


def bar_from(text: str, ccfg: Any) -> str:
    """The writer's bar with the condition's tags: its own block's body when it wrote one, else its
    whole answer (thinking removed)."""
    answer = split_thinking(text)[1]
    match = _BLOCK.search(answer)
    return wrap((match.group(1) if match else answer).strip(), ccfg)


class WriterBackends:
    """The writer backend of each condition: the run's own, or one composed from its overrides
    (loaded once, on first use)."""

    def __init__(self, model: ModelConfig, backend: Backend):
        self.loaded = {(): (backend, model)}

    def __call__(self, ccfg: Any) -> tuple[Any, Any]:
        key = tuple(ccfg.status.writer_overrides)
        if key not in self.loaded:
            from hydra import compose

            wcfg = to_typed(compose("config", overrides=list(key)))  # inside the running Hydra app
            self.loaded[key] = (make_backend(wcfg.model, wcfg.backend), wcfg.model)
        return self.loaded[key]


def write_bars(batch: list[Any], backend_for: Any) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """The stage before generation, for the steps of `batch` (harness.flow.rounds.Step) whose bar a
    model writes and whose prompt shows it now (the bar's cadence): generate their bars and return
    the batch with each such step's request showing its bar (new steps; the others as they were),
    and what each record's `writer` field holds (its `error` set where no bar could be written: that
    step is not answered, see `unwritten`). `backend_for(condition_cfg)` returns the writer
    (backend, model config) of a condition."""
    todo = [s for s in batch if s.condition_cfg.status and s.condition_cfg.status.source == BarSource.model
            and shows_now(s.episode, s.condition_cfg.status)]
    groups: dict[tuple, list[Any]] = {}
    for s in todo:
        groups.setdefault(tuple(s.condition_cfg.status.writer_overrides), []).append(s)
    info: dict[str, dict[str, Any]] = {}
    placed: dict[str, Any] = {}
    for samples in groups.values():
        backend, model = backend_for(samples[0].condition_cfg)
        for s, c in zip(samples, backend.generate([writer_request(s) for s in samples])):
            bar = bar_from(c.text, s.condition_cfg.status) if not c.error else None
            if bar is not None:  # the same pipeline as every bar: loop guard and turn meta stay
                shown = view(s.episode, s.shown, bar)
                placed[s.sample_id] = replace(s, request=replace(s.request, messages=shown.messages,
                                                                 annotations=shown.annotations()))
            info[s.sample_id] = {"bar": bar, "error": c.error, "prompt_tokens": c.prompt_tokens,
                                 "completion_tokens": c.completion_tokens, "latency_s": c.latency_s,
                                 "cost_usd": cost_usd(model, c), "model": model.name, "scripted": c.scripted,
                                 "text": c.text}
    return [placed.get(s.sample_id, s) for s in batch], info


def unwritten(info: dict[str, Any]) -> Completion | None:
    """The completion of a sample whose bar could not be written: an `error` record, never an answer
    without its bar (so the main model is not asked); None for a sample with its bar or none to write."""
    return Completion(error=f"writer: {info['error']}", scripted=info["scripted"]) if info and info["error"] else None

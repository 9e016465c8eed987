"""Replays completions from a JSONL file, for tests and for grading outputs produced elsewhere.

Each line: {"episode_id": ..., "condition": ..., "replicate": 0 (optional), "text": ...,
"reasoning": ... (optional), "tool_calls": [...] (optional), "usage": {...} (optional)}.
With match=order the i-th line answers the i-th sample of the plan. Every completion it returns is
marked scripted.

Token counts: a line's `usage` wins; otherwise the completion is counted with the model config's
tokenizer when it is on this machine (harness.measure.tokencount), and `token_source` says which. The
thinking count's source (`thinking_tokens_source`): the line's own where it names one (api, counted,
estimated), else `api` for a usage (what a server reported) and `estimated` for the tokenizer's count
of the visible text. A line's `finish_reason` is kept; without one, a completion of at least
max_new_tokens tokens is `length` (cut at the limit), so it grades as `truncated`, not as a
deliberate answer.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import MISSING

from harness.backends import Backend
from harness.config.schemas import BackendConfig, ModelConfig, require
from harness.errors import ConfigError
from harness.io.jsonl import read_lines
from harness.io.validate import TOKEN_FIELDS, of_type, token_count
from harness.measure.tokencount import load_counter
from harness.measure.toolcalls import MAX_CALL_CHARS, MAX_DEPTH, bounded
from harness.render import split_thinking, thinking_span
from harness.types import THINKING_SOURCES, Completion, Request


class Match(StrEnum):
    id = "id"  # by (episode_id, condition[, replicate])
    order = "order"  # the i-th line answers the i-th sample of the plan


@dataclass
class ScriptedBackendConfig(BackendConfig):
    name: str = "scripted"
    path: str = MISSING  # JSONL of completions
    match: Match = Match.id
    # the file is identity by its content (completions_sha256), not by where it lies
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"path"})

    def check_machine(self) -> None:
        require(os.path.isfile(os.path.expanduser(self.path)), "backend.path", f"file {self.path!r} does not exist")

    def preflight(self) -> None:
        load_lines(self.path)  # every line checked before a run writes anything

    def takes_thinking_settings(self) -> bool:
        return True  # completions made elsewhere with them, graded here

    def identity(self) -> dict[str, Any]:
        # another completions file is another set of outputs (hashed as bytes: a file with invalid UTF-8 is
        # refused, naming its line, when the backend loads it, not here)
        return {**super().identity(), "completions_sha256": hashlib.sha256(Path(self.path).expanduser().read_bytes()).hexdigest()}


def _check(row: dict[str, Any]) -> None:
    """Every field a completion takes, typed as it will be used (ValueError naming the field)."""
    for key in ("episode_id", "condition", "text", "reasoning", "finish_reason", "thinking_tokens_source"):
        of_type(row, key, (str,))
    if row.get("thinking_tokens_source") not in (None, *THINKING_SOURCES):
        raise ValueError(f"field 'thinking_tokens_source' must be one of {', '.join(THINKING_SOURCES)}")
    of_type(row, "replicate", (int,))
    for i, call in enumerate(of_type(row, "tool_calls", (list,)) or []):
        if not isinstance(call, dict):
            raise ValueError(f"field 'tool_calls' item {i} must be an object, got {type(call).__name__}")
        if not bounded(call):  # a rollout's step record keeps these as given, and walks them recursively
            raise ValueError(f"field 'tool_calls' item {i} is nested deeper than {MAX_DEPTH} levels, larger than "
                             f"{MAX_CALL_CHARS} characters or holds NaN or infinity")
    usage = of_type(row, "usage", (dict,)) or {}
    for key in TOKEN_FIELDS:
        token_count(usage.get(key), f"usage.{key}")


def load_lines(path: str) -> list[dict[str, Any]]:
    rows = []
    for n, row in read_lines(path, f"backend.path: {path}", ConfigError):
        try:
            _check(row)
        except ValueError as exc:
            raise ConfigError(f"backend.path: {path} line {n}: {exc}") from None
        rows.append(row)
    return rows


class ScriptedBackend(Backend):
    config_class = ScriptedBackendConfig
    name = "scripted"

    def __init__(self, model_cfg: ModelConfig, cfg: ScriptedBackendConfig):
        self.cfg = cfg
        self.rows = load_lines(cfg.path)
        self.count = load_counter(model_cfg)
        self.by_key: dict[tuple, dict[str, Any]] = {}
        for row in self.rows:
            if cfg.match == "id":
                if "episode_id" not in row or "condition" not in row:
                    raise ConfigError(f"backend.path: with backend.match=id every line needs episode_id and condition ({cfg.path})")
                self.by_key[(row["episode_id"], row["condition"], row.get("replicate"))] = row

    def describe(self) -> dict[str, Any]:
        return {"path": self.cfg.path, "lines": len(self.rows), "match": self.cfg.match,
                "token_counts": self.count.source if self.count else "usage fields of the lines only"}

    def _row(self, req: Request) -> dict[str, Any] | None:
        if self.cfg.match == "order":
            return self.rows[req.index] if req.index < len(self.rows) else None
        return self.by_key.get((req.episode_id, req.condition, req.replicate)) or self.by_key.get((req.episode_id, req.condition, None))

    def generate(self, requests: list[Request]) -> list[Completion]:
        out = []
        for req in requests:
            row = self._row(req)
            if row is None:
                out.append(Completion(error=f"scripted: no completion for episode {req.episode_id} condition {req.condition} "
                                            f"replicate {req.replicate}", scripted=True))
                continue
            out.append(self._completion(row, req))
        return out

    def _completion(self, row: dict[str, Any], req: Request) -> Completion:
        text = row.get("text", "")
        reasoning = row.get("reasoning") or split_thinking(text)[0]
        usage = row.get("usage") or {}
        tokens = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "thinking_tokens", "answer_tokens")}
        source = "usage" if usage else None
        thinking_source = "api" if tokens["thinking_tokens"] is not None else None
        if tokens["completion_tokens"] is None and self.count:
            in_text = self.count(text)
            if row.get("reasoning"):  # a separate reasoning field, generated beside the text
                thinking = self.count(row["reasoning"])
                completion = in_text + thinking
            else:  # thinking inside the text, its tags included (all of it when cut off before </think>)
                thinking, completion = self.count(thinking_span(text)), in_text
            tokens.update(completion_tokens=completion, thinking_tokens=thinking, answer_tokens=max(completion - thinking, 0))
            source, thinking_source = self.count.source, "estimated"
        finish = row.get("finish_reason")
        if finish is None and tokens["completion_tokens"] is not None and tokens["completion_tokens"] >= req.generation.max_new_tokens:
            finish = "length"
        if tokens["thinking_tokens"] is not None:
            thinking_source = row.get("thinking_tokens_source") or thinking_source
        return Completion(text=text, reasoning=reasoning, tool_calls=row.get("tool_calls") or [], **tokens,
                          finish_reason=finish, scripted=True, token_source=source, thinking_tokens_source=thinking_source)

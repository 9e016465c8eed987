"""Replays completions from a JSONL file, for tests and for grading outputs produced elsewhere.

Each line: {"episode_id": ..., "condition": ..., "replicate": 0 (optional), "text": ...,
"reasoning": ... (optional), "tool_calls": [...] (optional), "usage": {...} (optional)}.
With match=order the i-th line answers the i-th sample of the plan. Every completion it returns is
marked scripted.
"""
from __future__ import annotations

from typing import Any

from harness.config import ConfigError, ScriptedBackendConfig
from harness.jsonl import read_lines
from harness.render import split_thinking
from harness.types import Completion, Request
from harness.validate import TOKEN_FIELDS, of_type, token_count


def _check(row: dict[str, Any]) -> None:
    """Every field a completion takes, typed as it will be used (ValueError naming the field)."""
    for key in ("episode_id", "condition", "text", "reasoning", "finish_reason"):
        of_type(row, key, (str,))
    of_type(row, "replicate", (int,))
    for i, call in enumerate(of_type(row, "tool_calls", (list,)) or []):
        if not isinstance(call, dict):
            raise ValueError(f"field 'tool_calls' item {i} must be an object, got {type(call).__name__}")
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


class ScriptedBackend:
    name = "scripted"

    def __init__(self, cfg: ScriptedBackendConfig):
        self.cfg = cfg
        self.rows = load_lines(cfg.path)
        self.by_key: dict[tuple, dict[str, Any]] = {}
        for row in self.rows:
            if cfg.match == "id":
                if "episode_id" not in row or "condition" not in row:
                    raise ConfigError(f"backend.path: with backend.match=id every line needs episode_id and condition ({cfg.path})")
                self.by_key[(row["episode_id"], row["condition"], row.get("replicate"))] = row

    def describe(self) -> dict[str, Any]:
        return {"path": self.cfg.path, "lines": len(self.rows), "match": self.cfg.match}

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
            text = row.get("text", "")
            reasoning = row.get("reasoning") or split_thinking(text)[0]
            usage = row.get("usage") or {}
            out.append(Completion(text=text, reasoning=reasoning, tool_calls=row.get("tool_calls") or [],
                                  prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                                  thinking_tokens=usage.get("thinking_tokens"), answer_tokens=usage.get("answer_tokens"),
                                  finish_reason=row.get("finish_reason"), scripted=True))
        return out

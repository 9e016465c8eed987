"""Replays completions from a JSONL file, for tests and for grading outputs produced elsewhere.

Each line: {"episode_id": ..., "condition": ..., "replicate": 0 (optional), "text": ...,
"reasoning": ... (optional), "tool_calls": [...] (optional), "usage": {...} (optional)}.
With match=order the i-th line answers the i-th sample of the plan. Every completion it returns is
marked scripted.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from harness.backends import register_backend
from harness.config import BackendConfig, ConfigError, ModelConfig, require
from harness.jsonl import iter_lines
from harness.render import split_thinking
from harness.types import Completion, Request, sha256


class Match(StrEnum):
    id = "id"  # by (episode_id, condition[, replicate])
    order = "order"  # the i-th line answers the i-th sample of the plan


@dataclass
class ScriptedBackendConfig(BackendConfig):
    name: str = "scripted"
    path: str = MISSING  # JSONL of completions
    match: Match = Match.id

    def check_machine(self) -> None:
        require(os.path.isfile(os.path.expanduser(self.path)), "backend.path", f"file {self.path!r} does not exist")

    def identity(self) -> dict[str, Any]:
        # another completions file is another set of outputs
        return {**super().identity(), "completions_sha256": sha256(Path(self.path).expanduser().read_text(encoding="utf-8"))}


def load_lines(path: str) -> list[dict[str, Any]]:
    rows = []
    for n, row in iter_lines(Path(path).expanduser().read_text(encoding="utf-8"), f"backend.path: {path}", ConfigError):
        if not isinstance(row, dict) or not isinstance(row.get("text", ""), str):
            raise ConfigError(f"backend.path: {path} line {n} must be an object with a string 'text'")
        rows.append(row)
    return rows


@register_backend("scripted", ScriptedBackendConfig)
class ScriptedBackend:
    name = "scripted"

    def __init__(self, model_cfg: ModelConfig, cfg: ScriptedBackendConfig):
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

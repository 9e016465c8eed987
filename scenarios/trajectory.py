"""Building agent trajectories for scenario families: messages in OpenAI chat format, one tag each."""
from __future__ import annotations

import json

from harness.types import Message


class Trajectory:
    """Accumulates messages with their tags (for attention regions) and numbers tool calls."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.tags: list[str] = []

    def add(self, tag: str, message: Message) -> None:
        self.messages.append(message)
        self.tags.append(tag)

    def tool_round(self, tag: str, name: str, arguments: dict, result: str) -> None:
        # nine alphanumerics: the strictest templates (Mistral's) and tool parsers accept only that
        call_id = f"call{sum(1 for m in self.messages if m.get('tool_calls')) + 1:05d}"
        self.add(tag, {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        self.add(tag, {"role": "tool", "tool_call_id": call_id, "name": name, "content": result})

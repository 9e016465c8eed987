"""What a condition shows the model, annotated with where every character came from.

Each message keeps the episode message it shows (`origin`; None for a message a mechanism added)
and the marks a mechanism wrote into its content (`Mark(start, end, region)`, character offsets):
the bar, a reminder, an envelope, a `<turn_meta>` block, the guard's answer. The attention probe,
the sample browser and the analysis read these marks; none of them looks for a mechanism by its
literal text, so a new wrapper or a new mechanism is found without teaching them its spelling.
Every edit goes through the methods below, which keep the marks right as content shifts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.types import Message

ADDED = "added"  # region of what an edit writes around a mechanism's text (the separators)


@dataclass(frozen=True)
class Mark:
    start: int
    end: int
    region: str


def _content(message: Message) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _separator(start: int, end: int) -> list[Mark]:
    return [Mark(start, end, ADDED)] if end > start else []


@dataclass
class Transcript:
    messages: list[Message]
    origins: list[int | None]
    marks: list[list[Mark]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.marks:
            self.marks = [[] for _ in self.messages]

    @classmethod
    def of(cls, messages: list[Message], origins: list[int | None]) -> Transcript:
        """Copies of `messages` (the episode's are never changed in place)."""
        return cls([dict(m) for m in messages], list(origins))

    def __len__(self) -> int:
        return len(self.messages)

    def insert(self, i: int, message: Message, region: str) -> None:
        """A message a mechanism adds, its whole content in `region`."""
        self.messages.insert(i, dict(message))
        self.origins.insert(i, None)
        self.marks.insert(i, [Mark(0, len(_content(message)), region)])

    def append(self, message: Message, region: str) -> None:
        self.insert(len(self.messages), message, region)

    def prepend(self, i: int, text: str, region: str, sep: str = "\n\n") -> None:
        """`text` and `sep` before message i's content; `text` is marked, `sep` is `added`."""
        shift = len(text) + len(sep)
        self.messages[i] = {**self.messages[i], "content": f"{text}{sep}{_content(self.messages[i])}"}
        self.marks[i] = ([Mark(0, len(text), region)] + _separator(len(text), shift)
                         + [Mark(m.start + shift, m.end + shift, m.region) for m in self.marks[i]])

    def extend(self, i: int, text: str, region: str, sep: str = "\n\n") -> None:
        """`sep` and `text` after message i's content; `text` is marked, `sep` is `added`."""
        old = _content(self.messages[i])
        start = len(old) + len(sep)
        self.messages[i] = {**self.messages[i], "content": f"{old}{sep}{text}"}
        self.marks[i] = self.marks[i] + _separator(len(old), start) + [Mark(start, start + len(text), region)]

    def replace(self, i: int, content: str, region: str | None = None) -> None:
        """New content for message i: marked as `region`, or (None) still the origin's own text."""
        self.messages[i] = {**self.messages[i], "content": content}
        self.marks[i] = [Mark(0, len(content), region)] if region else []

    def cut(self, i: int, keep: int, region: str) -> None:
        """Keep the first `keep` characters of message i (marks past them go, one across is shortened);
        where the text went, an empty mark of `region` (a silent cut shows nothing, but is known)."""
        self.messages[i] = {**self.messages[i], "content": _content(self.messages[i])[:keep]}
        self.marks[i] = [Mark(m.start, min(m.end, keep), m.region) for m in self.marks[i] if m.start < keep] \
            + [Mark(keep, keep, region)]

    def annotations(self) -> list[dict[str, Any]]:
        """Per message, as stored beside the prompt: {"origin": i or null, "marks": [[start, end, region], ...]}."""
        return [{"origin": o, "marks": [[m.start, m.end, m.region] for m in ms]} for o, ms in zip(self.origins, self.marks)]

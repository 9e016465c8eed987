"""Named regions of a rendered prompt, mapped to tokens through the tokenizer's offsets.

Where each message starts is found on the rendered text, for any chat template: the conversation
cut after message k and closed by a sentinel user turn renders identically to the full prompt up to
message k's own turn, so the longest common prefix marks message k's start. The sentinel keeps the
template's "is this the last message" logic (Qwen3 adds `<think></think>` to a final assistant
turn) from changing how earlier turns render. Within each message's stretch, the region is the
message's content as the template sees it (Hermes-converted when the template has no tools), text
a condition added to it being `added` or `status`; turn markers, role headers, the generation prompt
and any template preamble are `template`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from harness.types import Message

TEMPLATE = "template"  # scaffolding: turn markers, role headers, generation prompt, preamble
STATUS = "status"  # an <agent_status> block a condition added (its own message or merged into one)
ADDED = "added"  # text a condition added that is not a status bar: a message of its own or inside one
GENERATED = "generated"  # keys of the completion itself (only in the probe's masses)
_SENTINEL: Message = {"role": "user", "content": "\x00"}
_CALL_RECORD = re.compile(r"call_record_\d+")
_STATUS_BAR = re.compile(r"<agent_status\b.*?</agent_status>", re.DOTALL)


def region_group(name: str) -> str:
    """call_record_1, call_record_2, ... -> call_records; other names are their own group."""
    return "call_records" if _CALL_RECORD.fullmatch(name) else name


def episode_region_names(episode_messages: Sequence[Message], tags: Sequence[str]) -> list[str]:
    """One region name per episode message: its tag, with call records numbered (an assistant call
    and its tool result share one)."""
    if len(tags) != len(episode_messages):
        raise ValueError(f"episode has {len(tags)} tags for {len(episode_messages)} messages: regions need one tag each")
    names, n_records = [], 0
    for m, tag in zip(episode_messages, tags):
        if tag == "call_record":
            if m.get("role") != "tool":  # the tool result joins the call before it
                n_records += 1
            names.append(f"call_record_{max(n_records, 1)}")
        else:
            names.append(tag)
    return names


def message_parts(messages: Sequence[Message], shown: Sequence[Message], episode_messages: Sequence[Message],
                  tags: Sequence[str]) -> list[list[tuple[str, str]]]:
    """For each message the model sees: (text, region) pieces of its content as shown, in order.
    A message equal to one of the episode's takes that message's region. One a condition added or
    changed is split (_changed_message): an `<agent_status>` block is the status bar, an episode
    message's content inside it keeps that message's region, and every other character of its
    content (a `<turn_meta>` block before the question, a note after a tool result, the separators
    between them) is `added`."""
    names = episode_region_names(episode_messages, tags)
    known = [(_payload(m).strip(), n) for m, n in zip(episode_messages, names) if len(_payload(m).strip()) >= 8]
    parts = []
    for m, s in zip(messages, shown):
        text = _payload(s)
        if m in episode_messages:
            parts.append([(text.strip(), names[list(episode_messages).index(m)])])
        else:
            parts.append(_changed_message(text, _payload(m), known))
    return parts


def _changed_message(text: str, raw: str, known: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Pieces covering text (the content as shown) from its first to its last non-space character.
    raw is the content as the condition wrote it; what the shown form wraps around it (Hermes'
    `<tool_response>`, the tools prompt after a system message) goes, as for an unchanged message,
    to the region of the episode message it came from."""
    body = raw.strip()
    at = text.find(body) if body else -1
    if at < 0:  # the shown form rewrote the content itself: classify what is shown
        body = text.strip()
        at = text.find(body)
    end = at + len(body)
    origin = max((k for k in known if k[0] in body), key=lambda k: len(k[0]), default=None)
    bars = [(at + b.start(), at + b.end()) for b in _STATUS_BAR.finditer(body)]
    spans: list[tuple[int, int, str]] = []
    if origin:  # the original content, preferably where no bar covers it; a bar inside it is its own
        starts = _occurrences(text, origin[0], at, end)
        start = next((i for i in starts if not any(a < i + len(origin[0]) and i < b for a, b in bars)), starts[0])
        spans.append((start, start + len(origin[0]), origin[1]))
    spans += [(a, b, STATUS) for a, b in bars if not any(a < y and x < b for x, y, _ in spans)]
    spans.sort()
    pieces, cursor = [], at
    for a, b, name in spans:
        if a > cursor:
            pieces.append((text[cursor:a], ADDED))
        pieces.append((text[a:b], name))
        cursor = b
    if cursor < end:
        pieces.append((text[cursor:end], ADDED))
    outer = origin[1] if origin else ADDED
    head, tail = text[:at].lstrip(), text[end:].rstrip()
    # an empty list would leave the turn to `template`: a message with no plain content (a natively
    # rendered tool call) gets its whole turn as `added` instead
    return ([(head, outer)] if head else []) + pieces + ([(tail, outer)] if tail else []) or [(text.strip(), ADDED)]


def _occurrences(text: str, sub: str, lo: int, hi: int) -> list[int]:
    found, i = [], text.find(sub, lo, hi)
    while i >= 0:
        found.append(i)
        i = text.find(sub, i + 1, hi)
    return found


def _lcp(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def _payload(message: Message) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else ""


@dataclass
class PromptRegions:
    text: str  # the rendered prompt, exactly what the model sees
    names: list[str]  # region names, index = region id; 0 is template
    char_region: list[int]  # region id of every character of text

    def token_regions(self, offsets: Sequence[tuple[int, int]]) -> list[int]:
        """Region id of each token: that of its first character (empty spans are template)."""
        return [self.char_region[s] if e > s else 0 for s, e in offsets]


def prompt_regions(render: Callable[[list[Message]], str], messages: list[Message],
                   parts: list[list[tuple[str, str]]]) -> PromptRegions:
    """render: messages -> the prompt text (same template settings as generation, generation prompt
    included); parts: for each message, (text, region) pieces of its content as the template shows
    it (message_parts). A message whose pieces cannot be found in its turn (a natively rendered
    tool call has no plain content) gives its whole turn to its first piece's region."""
    if len(messages) != len(parts):
        raise ValueError(f"{len(messages)} messages but {len(parts)} part lists")
    full = render(messages)
    starts = [_lcp(render(messages[:k] + [_SENTINEL]), full) for k in range(len(messages) + 1)]
    region_ids = {TEMPLATE: 0}
    char_region = [0] * len(full)
    for k, pieces in enumerate(parts):
        lo, hi = starts[k], max(starts[k + 1], starts[k])
        cursor, placed = lo, False
        for text, name in pieces:
            at = full.find(text, cursor, hi) if text else -1
            if at >= 0:
                rid = region_ids.setdefault(name, len(region_ids))
                char_region[at:at + len(text)] = [rid] * len(text)
                cursor, placed = at + len(text), True
        if not placed and pieces:
            rid = region_ids.setdefault(pieces[0][1], len(region_ids))
            char_region[lo:hi] = [rid] * (hi - lo)
    return PromptRegions(full, list(region_ids), char_region)

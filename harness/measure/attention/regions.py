"""Named regions of a rendered prompt, mapped to tokens through the tokenizer's offsets.

Where each message starts is found on the rendered text, for any chat template: the conversation
cut after message k and closed by a sentinel user turn renders identically to the full prompt up to
message k's own turn, so the longest common prefix marks message k's start. The sentinel keeps the
template's "is this the last message" logic (Qwen3 adds `<think></think>` to a final assistant
turn) from changing how earlier turns render. Within each message's stretch, the region is the
message's content as the template sees it (Hermes-converted when the template has no tools): the
episode message it shows, or what the condition's marks say a mechanism wrote there (`status` for
the bar, `turn_meta`, `loop_guard`, `envelope`, ...); turn markers, role headers, the generation
prompt and any template preamble are `template`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from harness.context.transcript import ADDED
from harness.types import Message

TEMPLATE = "template"  # scaffolding: turn markers, role headers, generation prompt, preamble
GENERATED = "generated"  # keys of the completion itself (only in the probe's masses)
_SENTINEL: Message = {"role": "user", "content": "\x00"}
_CALL_RECORD = re.compile(r"call_record_\d+")


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


def message_parts(messages: Sequence[Message], shown: Sequence[Message], annotations: Sequence[dict],
                  names: Sequence[str]) -> list[list[tuple[str, str]]]:
    """For each message the model sees: (text, region) pieces of its content as shown, in order.
    `annotations` (the condition's, harness.context.transcript) give each message the episode
    message it shows (its region is that message's name, `names[origin]`) and the regions a
    mechanism marked in its content (the bar, a reminder, an envelope, `<turn_meta>`...); text of
    a message no mechanism marked and no episode message explains is `added`. What the shown form
    wraps around the content (Hermes' `<tool_response>`, the tools prompt after a system message)
    goes to the message's own region."""
    parts = []
    for m, s, a in zip(messages, shown, annotations):
        own = names[a["origin"]] if a.get("origin") is not None else None
        parts.append(_pieces(_payload(s), _payload(m), [tuple(x) for x in a.get("marks", [])], own))
    return parts


def _pieces(text: str, raw: str, marks: list[tuple[int, int, str]], own: str | None) -> list[tuple[str, str]]:
    """Pieces covering text (the content as shown) from its first to its last non-space character;
    raw is the content as the condition wrote it, with its marks."""
    body = raw.strip()
    at = text.find(body) if body else -1
    if at < 0:  # the shown form rewrote the content itself (a natively rendered call): one piece
        whole = own or (marks[0][2] if marks else ADDED)
        # an empty piece still claims the turn (a native tool call with no content)
        return [(text.strip(), whole)] if text.strip() or own else []
    shift = at - (len(raw) - len(raw.lstrip()))  # offsets of raw in text
    base = own or ADDED
    pieces, cursor, end = [], at, at + len(body)
    for start, stop, region in sorted(marks):
        a, b = max(start + shift, at), min(stop + shift, end)
        if b <= a:
            continue
        if a > cursor:
            pieces.append((text[cursor:a], base))
        pieces.append((text[a:b], region))
        cursor = b
    if cursor < end:
        pieces.append((text[cursor:end], base))
    outer = own or (pieces[0][1] if pieces else ADDED)
    head, tail = text[:at].lstrip(), text[end:].rstrip()
    return ([(head, outer)] if head else []) + pieces + ([(tail, outer)] if tail else [])


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

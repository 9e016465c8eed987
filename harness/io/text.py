"""The one rule for text entering statusbench from outside (a server's answer, a scripted line, a
user's trace): a lone UTF-16 surrogate (`"\\ud83d"`, half an emoji, legal in JSON but not in UTF-8)
becomes U+FFFD, the replacement character, so every file and tool downstream can encode it."""
from __future__ import annotations

import re
from typing import Any, Callable

SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def whole_chars(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (a valid pair was joined by the JSON parser)."""
    return SURROGATE.sub(REPLACEMENT, text)


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """`value` (parsed JSON) with fn applied to every string in it, keys included."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [map_strings(v, fn) for v in value]
    return value

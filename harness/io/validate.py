"""Checks of fields that come from outside (a user's files, a server's JSON) before they reach a
record: a wrong type is refused naming the field, never stored for no report to read again."""
from __future__ import annotations

from typing import Any

# far above any real count; a larger value is a broken or hostile input, not a measurement
MAX_TOKENS = 10**12
TOKEN_FIELDS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "thinking_tokens", "answer_tokens")


def token_count(value: Any, name: str) -> int | None:
    """None (unknown) or a count in [0, MAX_TOKENS]; ValueError naming the field otherwise (a
    string, a float such as inf/NaN, a negative number, a bool)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise ValueError(f"{name} must be a token count (an integer from 0 to {MAX_TOKENS}), got {_show(value)}")
    return value


def of_type(row: dict[str, Any], key: str, types: tuple[type, ...], optional: bool = True) -> Any:
    """row[key] if it is one of `types` (a bool is not an int here; absent/null allowed when
    optional); ValueError naming the field otherwise."""
    value = row.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join(t.__name__ for t in types) + (" or null" if optional else "")
        raise ValueError(f"field {key!r} must be {names}, got {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"

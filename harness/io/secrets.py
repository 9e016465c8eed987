"""Keeping API keys out of everything statusbench writes or prints.

A key lives only in the environment variable named by `backend.api_key_env`. A command line that
carries one (`+backend.api_key=...`, or a key given where the variable's name belongs) is refused
before Hydra composes or writes anything, and the refusal never repeats the value; every text a
server returns (answers, reasoning, tool-call arguments, errors) is redacted before it is stored or
printed.
"""
from __future__ import annotations

import re
from typing import Any

# override keys that can only mean a credential; `api_key_env` names a variable and is checked apart
SECRET_KEY = re.compile(r"(^|[._])(api_?key|secret|password|passwd|token|access_token|auth|authorization|bearer)$", re.I)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY_PREFIXES = ("sk-", "sk_", "gsk_", "hf_", "xai-", "pk-", "rk-", "Bearer ")
CREDENTIAL_URL = re.compile(r"://[^/@\s:]+:[^/@\s]+@")  # scheme://user:password@host
REDACTED = "[redacted]"
MIN_RUN = 12  # this many consecutive characters of a key count as the key


def looks_like_secret(value: str) -> bool:
    """Whether a value meant to be an environment variable's name looks like a key instead: not a
    valid variable name, a known key prefix, or long with mixed case and digits (names are
    conventionally UPPER_CASE)."""
    return (not ENV_NAME.fullmatch(value) or value.startswith(KEY_PREFIXES)
            or (len(value) >= 20 and bool(re.search(r"[a-z]", value)) and bool(re.search(r"[A-Z]", value))
                and bool(re.search(r"\d", value))))


def argv_secret_error(argv: list[str]) -> str | None:
    """The message refusing a command line that carries a key (the value never shown), or None."""
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.split("@")[0].endswith("api_key_env"):
            if value not in ("", "null") and looks_like_secret(value):
                return (f"{key}: must be the NAME of the environment variable holding the key (e.g. OPENAI_API_KEY); "
                        "the value given looks like a key itself and is not shown. Put the key in that variable")
        elif SECRET_KEY.search(key) or looks_like_key_value(value):
            return secret_message(key)
    return None


def secret_message(key: str) -> str:
    return (f"{key}: keys are never part of the config (it is written to .hydra/ and manifest.json); the value "
            "is not shown. Put the key in the environment variable named by backend.api_key_env")


def looks_like_key_value(value: str) -> bool:
    """A config value that is a key whatever its name: a known key prefix, or a URL with a password."""
    return value.startswith(KEY_PREFIXES) or bool(CREDENTIAL_URL.search(value))


def config_secret_path(node: Any, path: str = "") -> str | None:
    """The dotted path of the first value in a resolved config (nested dicts and lists) that looks
    like a key (`looks_like_key_value`), or None: an override under a harmless name
    (`+backend.extra_body.x_key=sk-...`), a `${oc.env:...}` that resolved to a key, a URL with
    credentials; all would be written to .hydra/ and manifest.json."""
    if isinstance(node, dict):
        children = node.items()
    elif isinstance(node, list):
        children = enumerate(node)
    else:
        return path if isinstance(node, str) and looks_like_key_value(node) else None
    for key, child in children:
        found = config_secret_path(child, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def redact(text: str, *secrets: str | None) -> str:
    """`text` with each non-empty secret replaced by [redacted]: every run of MIN_RUN or more
    consecutive characters of it (a key cut in two, or half of it, still names it); a secret
    shorter than that, wherever it occurs whole."""
    for secret in secrets:
        if not secret or len(secret) < 4:  # a 1-3 character "key" would redact ordinary words
            continue
        if len(secret) <= MIN_RUN:
            text = text.replace(secret, REDACTED)
            continue
        grams = {secret[i:i + MIN_RUN] for i in range(len(secret) - MIN_RUN + 1)}
        # every start of a MIN_RUN-long piece of the key (overlapping, hence the lookahead); a longer
        # run of the key is a chain of such pieces, merged below
        starts = [m.start() for m in re.finditer(f"(?=(?:{'|'.join(map(re.escape, grams))}))", text)]
        if not starts:
            continue
        out, begin, end, last = [], starts[0], starts[0] + MIN_RUN, 0
        for start in starts[1:] + [len(text) + MIN_RUN]:  # a sentinel past the end closes the last run
            if start > end:
                out += [text[last:begin], REDACTED]
                last, begin = end, start
            end = start + MIN_RUN
        text = "".join(out) + text[last:]
    return text

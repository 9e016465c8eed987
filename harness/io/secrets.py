"""Keeping API keys out of everything statusbench writes or prints.

A key lives only in the environment variable named by `backend.api_key_env`. A command line that
carries one (`+backend.api_key=...`, a value shaped like a known provider's key anywhere in a value,
a URL with a password or a `?api_key=` parameter, or the value of a key variable of this
environment) is refused before Hydra composes or writes anything, and the refusal never repeats the
value; the resolved config is checked the same way before any file is written. Every text a server
returns (answers, reasoning, tool-call arguments, errors) is redacted before it is stored or
printed, in the shapes a server or a model may echo a key in (see `redact`).
"""
from __future__ import annotations

import base64
import bisect
import os
import re
from typing import Any, Iterator

# override keys that can only mean a credential; `api_key_env` names a variable and is checked apart
SECRET_KEY = re.compile(r"(^|[._])(api_?key|secret|password|passwd|token|access_token|auth|authorization|bearer)$", re.I)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY_PREFIXES = ("sk-", "sk_", "gsk_", "hf_", "xai-", "pk-", "rk-", "Bearer ")
# the shapes providers give their keys, anywhere in a value (not inside a longer word): a prefix and
# enough random characters that an ordinary name (`run.name=hf_clean`, `risk-aware`) never matches
KEY_SHAPE = re.compile(r"(?<![A-Za-z0-9])(?:"
                       # OpenAI, Anthropic, Stripe-like: after the prefix and any labels (`proj-`), 16+ letters and digits
                       r"(?:sk|pk|rk)[-_][A-Za-z0-9_-]*?(?=[A-Za-z0-9]{16})[A-Za-z0-9]*\d"
                       r"|gsk_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{30,}|xai-[A-Za-z0-9]{20,}"  # Groq, Hugging Face, xAI
                       r"|AIza[0-9A-Za-z_-]{35}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}"  # Google, GitHub
                       r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|Bearer\s+[A-Za-z0-9._~+/-]{16,}=*)")
CREDENTIAL_URL = re.compile(r"://[^/@\s:]+:[^/@\s]+@")  # scheme://user:password@host
# a URL query parameter that carries a credential (`...?api_key=sk-...`, `&token=...`)
CREDENTIAL_PARAM = re.compile(r"[?&;](?:api[_-]?key|key|token|access[_-]?token|auth|secret|password|passwd|sig|signature)=[^&#\s]",
                              re.I)
# an environment variable whose name says it holds a credential (OPENAI_API_KEY, HF_TOKEN, DB_PASSWORD)
CREDENTIAL_ENV = re.compile(r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)", re.I)
REDACTED = "[redacted]"
MIN_RUN = 12  # this many consecutive characters of a key count as the key
_ALNUM = re.compile(r"[A-Za-z0-9]+")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def looks_like_secret(value: str) -> bool:
    """Whether a value meant to be an environment variable's name looks like a key instead: not a
    valid variable name, a known key prefix, or long with mixed case and digits (names are
    conventionally UPPER_CASE)."""
    return (not ENV_NAME.fullmatch(value) or value.startswith(KEY_PREFIXES)
            or (len(value) >= 20 and bool(re.search(r"[a-z]", value)) and bool(re.search(r"[A-Z]", value))
                and bool(re.search(r"\d", value))))


def environment_keys(api_key_env: str | None = None) -> list[str]:
    """The keys this process can know of: the value of `api_key_env` (the variable the backend reads)
    and of every variable whose name says it holds a credential, at least MIN_RUN characters long (a
    short value such as `1` would match ordinary text)."""
    named = [os.environ.get(api_key_env)] if api_key_env else []
    return [v for v in named if v] + [v for k, v in os.environ.items() if CREDENTIAL_ENV.search(k) and len(v) >= MIN_RUN]


def argv_secret_error(argv: list[str]) -> str | None:
    """The message refusing a command line that carries a key (the value never shown), or None."""
    values = [arg.split("=", 1) for arg in argv if not arg.startswith("-") and "=" in arg]
    named = [v for k, v in values if k.lstrip("+~").split("@")[0].endswith("api_key_env") and ENV_NAME.fullmatch(v)]
    known = environment_keys(named[-1] if named else None)
    for key, value in values:
        key = key.lstrip("+~")
        if key.split("@")[0].endswith("api_key_env"):
            if value not in ("", "null") and looks_like_secret(value):
                return (f"{key}: must be the NAME of the environment variable holding the key (e.g. OPENAI_API_KEY); "
                        "the value given looks like a key itself and is not shown. Put the key in that variable")
        elif SECRET_KEY.search(key) or looks_like_key_value(value) or holds_key(value, known):
            return secret_message(key)
    return None


def secret_message(key: str) -> str:
    return (f"{key}: keys are never part of the config (it is written to .hydra/ and manifest.json); the value "
            "is not shown. Put the key in the environment variable named by backend.api_key_env")


def looks_like_key_value(value: str) -> bool:
    """A config value that is, or holds, a key whatever its name: a provider's key shape anywhere in
    it, a URL with a password or with a credential query parameter."""
    return bool(KEY_SHAPE.search(value) or CREDENTIAL_URL.search(value) or CREDENTIAL_PARAM.search(value))


def holds_key(value: str, keys: list[str]) -> bool:
    """Whether `value` holds one of `keys` in any shape `redact` removes."""
    return bool(keys) and redact(value, *keys) != value


def config_secret_path(node: Any) -> str | None:
    """The dotted path of the first value in a resolved config (nested dicts and lists) that is or
    holds a key: one shaped like a key (`looks_like_key_value`: an override under a harmless name,
    `+backend.extra_body.x_key=sk-...`, a URL with credentials) or the value, in any shape `redact`
    knows, of the variable `backend.api_key_env` names or of another credential variable (a
    `${oc.env:...}` that resolved to a key without a known prefix); all would be written to .hydra/
    and manifest.json."""
    backend = node.get("backend") if isinstance(node, dict) else None
    keys = environment_keys(backend.get("api_key_env") if isinstance(backend, dict) else None)
    return next((path for path, value in _strings(node) if looks_like_key_value(value) or holds_key(value, keys)), None)


def _strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(dotted path, value) of every string in nested dicts and lists, keys included."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
    if children is None:
        if isinstance(node, str):
            yield path, node
        return
    for key, child in children:
        where = f"{path}.{key}" if path else str(key)
        if isinstance(key, str):
            yield where, key
        yield from _strings(child, where)


# --- redaction ---------------------------------------------------------------------------------

def _base64_cores(data: bytes) -> list[str]:
    """The base64 and base64url text that encodes `data` inside any longer text: base64 works on
    groups of 3 bytes, so where `data` starts in the longer text (0, 1 or 2 bytes past a group's
    start) changes every character; for each start, the characters of the groups that hold only
    bytes of `data`. `Bearer <key>` (or any text around the key) is covered by the same three."""
    cores = []
    for skip in range(3):
        body = data[skip:]
        text = base64.b64encode(body[:len(body) // 3 * 3]).decode("ascii")
        cores += [text, text.replace("+", "-").replace("/", "_")]
    return cores


def _shapes(secret: str) -> list[tuple[str, int]]:
    """(a shape the secret may be echoed in, how many consecutive characters of it name the key):
    as is and reversed (MIN_RUN characters), base64/base64url at each alignment (any MIN_RUN bytes of
    the key span at least MIN_RUN whole base64 characters), hex in either case (2 per byte)."""
    data = secret.encode("utf-8")
    return ([(secret, MIN_RUN), (secret[::-1], MIN_RUN)] + [(core, MIN_RUN) for core in _base64_cores(data)]
            + [(data.hex(), 2 * MIN_RUN), (data.hex().upper(), 2 * MIN_RUN)])


class _View:
    """Text derived from another (percent-escapes decoded, separators dropped) with a map of each of
    its characters back to the span of the original it came from. Built from segments: a run of
    characters copied one to one, or one character standing for several (`%2D` -> `-`)."""

    def __init__(self, pieces: list[tuple[int, int, str, bool]]):
        # pieces: (original start, original end, text, one_to_one)
        self.text = "".join(p[2] for p in pieces)
        self.starts, self.pieces, at = [], pieces, 0
        for piece in pieces:
            self.starts.append(at)
            at += len(piece[2])

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span the view's characters [start, end) came from."""
        return self._where(start)[0], self._where(end - 1)[1]

    def _where(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.starts, i) - 1
        o_start, o_end, _, one_to_one = self.pieces[k]
        return (o_start + i - self.starts[k], o_start + i - self.starts[k] + 1) if one_to_one else (o_start, o_end)


def _percent_decoded(text: str) -> _View:
    pieces, at = [], 0
    for m in _PERCENT.finditer(text):
        pieces += [(at, m.start(), text[at:m.start()], True), (m.start(), m.end(), chr(int(m.group(1), 16)), False)]
        at = m.end()
    return _View(pieces + [(at, len(text), text[at:], True)])


def _letters_and_digits(view: _View) -> _View:
    """The view with every character but ASCII letters and digits dropped: a key spelled out with
    spaces, dashes, newlines or any other separator between its characters reads as the key."""
    pieces = []
    for m in _ALNUM.finditer(view.text):
        o_start, o_end = view.span(m.start(), m.end())
        if o_end - o_start == len(m.group()):  # copied one to one from the original
            pieces.append((o_start, o_end, m.group(), True))
        else:
            pieces += [(*view.span(i, i + 1), ch, False) for i, ch in enumerate(m.group(), m.start())]
    return _View(pieces)


def _runs(text: str, shapes: list[tuple[str, int]]) -> Iterator[tuple[int, int]]:
    """Spans of text where `run` consecutive characters of a shape occur, for each (shape, run).
    Linear in the text: positions are probed with a stride, and only a probe that hits a piece of a
    shape is looked at closely. A run of length n, probed every n // 2 characters with a window of
    n - n // 2 + 1, has a probe fully inside every occurrence."""
    by_run: dict[int, set[str]] = {}
    for shape, run in shapes:
        by_run.setdefault(run, set()).update(shape[i:i + run] for i in range(len(shape) - run + 1))
    for run, grams in by_run.items():
        if not grams:
            continue
        stride = run // 2
        width = run - stride + 1
        probes = {g[i:i + width] for g in grams for i in range(run - width + 1)}
        found: set[int] = set()
        for probe in range(0, len(text) - width + 1, stride):
            if text[probe:probe + width] in probes:
                found.update(s for s in range(max(0, probe + width - run), probe + 1) if text[s:s + run] in grams)
        yield from ((s, s + run) for s in found)


def _strip(shape: str) -> str:
    return "".join(_ALNUM.findall(shape))


def redact(text: str, *secrets: str | None) -> str:
    """`text` with each non-empty secret replaced by [redacted] in every shape a server or a model
    may echo it in: any run of MIN_RUN or more consecutive characters of it (a key cut in two, or
    half of it, still names it), reversed, base64 or base64url (of the key or of a longer text
    holding it, e.g. `Bearer <key>`), hex in either case, percent-encoded, or spelled out with
    separators between its characters; a secret shorter than MIN_RUN, wherever it occurs whole.
    Linear in the length of the text."""
    long_ = [s for s in secrets if s and len(s) > MIN_RUN]
    for secret in (s for s in secrets if s and 4 <= len(s) <= MIN_RUN):  # 1-3 characters would redact words
        text = text.replace(secret, REDACTED)
    if not long_ or not text:
        return text
    shapes = [shape for s in long_ for shape in _shapes(s)]
    stripped = [(_strip(shape), run) for shape, run in shapes]
    spans = list(_runs(text, shapes))
    views = [_View([(0, len(text), text, True)])]
    if "%" in text:
        views.append(_percent_decoded(text))
        spans += [views[1].span(s, e) for s, e in _runs(views[1].text, shapes)]
    for view in map(_letters_and_digits, views):
        spans += [view.span(s, e) for s, e in _runs(view.text, stripped)]
    return _replace(text, spans)


def _replace(text: str, spans: list[tuple[int, int]]) -> str:
    """text with each group of overlapping or touching spans replaced by one REDACTED."""
    out, last, begin, end = [], 0, None, None
    for start, stop in sorted(spans) + [(len(text) + 1, len(text) + 1)]:  # a sentinel closes the last group
        if end is not None and start > end:
            out += [text[last:begin], REDACTED]
            last, begin, end = end, None, None
        if end is None:
            begin, end = start, stop
        else:
            end = max(end, stop)
    return "".join(out) + text[last:]

"""Tool calls read from a model's answer (never its thinking), in every format models write them and
the tool-call parsers of vLLM, llama.cpp and the major APIs read. Each call records its `call_format`.

Where the call is (the wrapper), first match wins:

- `hermes`: `<tool_call>...</tool_call>` blocks (Hermes, Qwen 2.5; vLLM `hermes`), an unterminated
  last block running to the end;
- `json_fence`: in a ```json (or bare ```) fence;
- `python_tag`: after Llama 3.x's `<|python_tag|>` (vLLM `llama3_json`);
- `mistral`: after `[TOOL_CALLS]`, a list of objects or `name[ARGS]{...}` (vLLM `mistral`, llama.cpp Mistral Nemo);
- `firefunction`: after ` functools` (llama.cpp Firefunction v2);
- `command_r`: after `<|START_ACTION|>` (llama.cpp Command R7B);
- `granite`: after `<|tool_call|>` (vLLM `granite`);
- `function_tag`: `<function=name>{...}</function>` (Llama 3.1 custom tools, llama.cpp Functionary v3.1)
  or with `<parameter=k>v</parameter>` (Qwen3-Coder);
- `functionary`: `>>>name` and the arguments on the next line (llama.cpp Functionary v3.2);
- `harmony`: gpt-oss `to=functions.name ... <|message|>{...}`;
- `deepseek`: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name` and a JSON fence (llama.cpp DeepSeek R1, V3);
- `kimi_k2`: `functions.name:0<|tool_call_argument_begin|>{...}` (vLLM `kimi_k2`);
- `bare_json`: an object (or a list of them) starting a line; `inline_json`: after other text on its
  line ("Sure: {"name": ...}"); `python_dict`: either, written as a python literal (single quotes);
- `pythonic`: `[name(a=1), other(b="x")]` (vLLM `pythonic`, Llama 3.2/4);
- `python_call`: `name(a=1)`, `functions.name(...)`, `tools.name(...)`, `default_api.name(...)` written
  as a statement: at a line's start (after list or quote marks, a backtick, `>>>`), after a colon, or
  anywhere with a namespace. Only the episode's own tools, with literal arguments (read with
  `ast.literal_eval`, never evaluated); `name()` with no arguments counts only alone on its line,
  so a sentence that mentions `phone_call()` is text. A tool written as python inside a sentence is
  not a call here (the grader says so: `python_call_syntax`);
- `native`: the backend's API-style `tool_calls`.

What is a call object, in any wrapper: a name under `name`, `function` or `tool_name`, and arguments
under `arguments`, `parameters`, `args` or `input` (an object or a JSON string): the shapes of OpenAI
(`{"function": {...}}` items, legacy `function_call`), Anthropic (`tool_use`: `input`), the Responses
API (`function_call`), Gemini (`functionCall`: `args`), llama.cpp's generic format (`tool_call`,
`tool_calls`) and Command R (`tool_name`, `parameters`); an object naming one of the episode's tools
with its arguments beside the name (`{"name": "phone_call", "company": "Xfinity"}`) too. A tool's
definition (`parameters` holding a JSON schema) is no call.

Model output is untrusted: a call is read from at most MAX_CALL_CHARS characters and MAX_DEPTH
levels of nesting, with `json.loads` or `ast.literal_eval` only; one past either limit, or one that
opens like a call and does not parse, is a malformed call (graded `other`), never a crash, and its
arguments are never kept. A completion stopped by the token limit (`cut`) whose last call runs to
its end is read as far as it was written (the open string and brackets closed, else the last
complete argument kept): the call is flagged `cut`, and graded on the name and arguments it shows.
"""
from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

MAX_CALL_CHARS = 16_384
MAX_DEPTH = 32  # nesting of brackets in a call (the call's own object and its arguments' containers)
MAX_NAME_CHARS = 128
CALL_FORMATS = ("hermes", "json_fence", "bare_json", "inline_json", "python_dict", "python_tag", "mistral",
                "firefunction", "command_r", "granite", "function_tag", "functionary", "harmony", "deepseek",
                "kimi_k2", "pythonic", "python_call", "native")


@dataclass(frozen=True)
class ParsedCall:
    name: str | None
    arguments: dict[str, Any]
    call_format: str  # one of CALL_FORMATS
    malformed: bool = False
    cut: bool = False  # ran to the end of a completion stopped by the token limit: read as far as written


def call_format(calls: list[ParsedCall]) -> str | None:
    """The sample's call format: its calls' one format, `mixed` for several, None without a call."""
    formats = {c.call_format for c in calls}
    return None if not formats else formats.pop() if len(formats) == 1 else "mixed"


def bounded(value: Any) -> bool:
    """Within MAX_DEPTH levels and MAX_CALL_CHARS nodes and characters, counted without recursion
    (what asdict, canonical_json and the loop guard's hash later walk recursively), and strict JSON
    (no NaN or infinity, which canonical_json refuses)."""
    stack, size = [(value, 1)], 0
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH or (isinstance(v, float) and not math.isfinite(v)):
            return False
        size += 1 + (len(v) if isinstance(v, str) else 0)
        if size > MAX_CALL_CHARS:
            return False
        if isinstance(v, dict):
            stack += [(k, depth + 1) for k in v] + [(x, depth + 1) for x in v.values()]
        elif isinstance(v, list):
            stack += [(x, depth + 1) for x in v]
    return True


# ---- reading one bracketed span: bounded, iterative --------------------------------------------

_CLOSER = {"{": "}", "[": "]", "(": ")"}


@dataclass(frozen=True)
class _Span:
    end: int  # after the closing bracket; where reading stopped otherwise
    closed: bool
    too_big: bool  # deeper than MAX_DEPTH or longer than MAX_CALL_CHARS
    heals: tuple[str, ...] = ()  # an unclosed span at the text's end: completions to try, best first


def _scan(text: str, start: int) -> _Span:
    """The bracketed span opening at text[start], strings in either quote skipped."""
    stack: list[str] = []
    quote = None
    commas: list[tuple[int, str]] = []  # the last separators outside strings, with the closers they need
    deepest, i, limit = 0, start, min(len(text), start + MAX_CALL_CHARS)
    while i < limit:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in _CLOSER:
            stack.append(_CLOSER[ch])
            deepest = max(deepest, len(stack))
        elif ch in ")]}":
            if stack[-1] != ch:
                return _Span(i, False, False)
            stack.pop()
            if not stack:
                return _Span(i + 1, True, deepest > MAX_DEPTH)
        elif ch == ",":
            commas = (commas + [(i, "".join(reversed(stack)))])[-4:]
        i += 1
    if limit < len(text) or deepest > MAX_DEPTH:
        return _Span(limit, False, True)
    closers = "".join(reversed(stack))
    heals = [text[start:] + (quote or "") + closers] + [text[start:at] + c for at, c in reversed(commas)]
    return _Span(len(text), False, False, tuple(heals))


def _value(src: str) -> tuple[Any, bool]:
    """(value, written as a python literal): JSON, else a python literal; ValueError for neither."""
    try:
        return json.loads(src), False
    except (ValueError, RecursionError):
        pass
    try:
        value = ast.literal_eval(src)
        return json.loads(json.dumps(value)), True  # tuples become lists; a set or bytes is no call
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError("neither JSON nor a python literal") from None


# ---- what a parsed value holds -------------------------------------------------------------------

_NAME_KEYS = ("name", "function", "tool_name")
_ARG_KEYS = ("arguments", "parameters", "args", "input")
_ONE_CALL_KEYS = ("tool_call", "function_call", "functionCall")  # llama.cpp generic, OpenAI legacy, Gemini
_NOT_ARGS = {"type", "id", "call_id"}


def _shape(obj: Any, tools: dict[str, list[str]]) -> tuple[Any, Any] | None:
    """(name, raw arguments) of one call object in any of the module's shapes; None: no call."""
    if not isinstance(obj, dict):
        return None
    inner = next((obj[k] for k in _ONE_CALL_KEYS if isinstance(obj.get(k), dict)), None)
    if inner is not None:
        obj = inner
    if isinstance(obj.get("function"), dict):  # an OpenAI tool_calls item
        obj = obj["function"]
    name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str)), None)
    if name is None:
        return None
    key = next((k for k in _ARG_KEYS if k in obj), None)
    if key is None:
        rest = {k: v for k, v in obj.items() if k not in _NAME_KEYS and k not in _NOT_ARGS}
        return (name, rest) if name in tools and rest else None
    args = obj[key]
    if key == "parameters" and isinstance(args, dict) and "properties" in args and args.get("type") == "object":
        return None  # the tool's definition echoed, not a call
    return name, args


def _calls_in(value: Any, tools: dict[str, list[str]]) -> list[tuple[Any, Any]] | None:
    """The calls a parsed object or list holds (every item a call), or None."""
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    shaped = [_shape(v, tools) for v in items]
    return shaped if shaped and all(s is not None for s in shaped) else None


def _call(name: Any, args: Any, fmt: str, cut: bool = False) -> ParsedCall:
    """One call checked: a short string name and arguments that are a bounded object (or its JSON)."""
    if isinstance(args, str):
        try:
            args = json.loads(args) if len(args) <= MAX_CALL_CHARS else None
        except (ValueError, RecursionError):
            args = None
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        return ParsedCall(None, {}, fmt, malformed=True, cut=cut)
    if not isinstance(args, dict) or not bounded(args):
        return ParsedCall(name, {}, fmt, malformed=True, cut=cut)
    return ParsedCall(name, args, fmt, cut=cut)


def _malformed(fmt: str, cut: bool = False) -> ParsedCall:
    return ParsedCall(None, {}, fmt, malformed=True, cut=cut)


# ---- python syntax ---------------------------------------------------------------------------------

def _python_args(call: ast.Call, params: list[str]) -> dict[str, Any] | None:
    """Literal keyword arguments (positional ones by the tool's parameter order); None otherwise."""
    if len(call.args) > len(params) or any(k.arg is None for k in call.keywords):
        return None
    try:
        args = {p: ast.literal_eval(a) for p, a in zip(params, call.args)}
        args.update({k.arg: ast.literal_eval(k.value) for k in call.keywords})
        return json.loads(json.dumps(args))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _python_calls(src: str, tools: dict[str, list[str]]) -> list[tuple[str, dict[str, Any] | None]] | None:
    """(tool, literal arguments or None) of each call in `src`, a call or a list of calls of the
    episode's tools; None when `src` is no such python expression."""
    try:
        tree = ast.parse(src.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    out = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in tools:
            return None
        out.append((name, _python_args(node, tools[name])))
    return out


_STATEMENT_PREFIX = re.compile(r"[\s>*#$`\-]*(?:\d+[.)]\s*)?`*\s*")
_NAMESPACE = r"(?:(?:functions|tools|default_api)\.)"


# ---- the reader --------------------------------------------------------------------------------------

# wrappers read first, each block's body alone (a DeepSeek call holds a fence, which must not be read as one)
_TAGS = [("hermes", re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)),
         ("deepseek", re.compile(r"<｜tool▁call▁begin｜>(.*?)(<｜tool▁call▁end｜>|$)", re.DOTALL))]
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)(```|$)", re.DOTALL)
# a call object's opening: `{` or `[{` and a quoted key (the key says whether a broken one was a call)
_OBJECT = re.compile(r"""(?:\[\s*)?\{\s*["']([A-Za-z_]+)["']\s*:""")
_CALL_KEYS = set(_NAME_KEYS) | set(_ONE_CALL_KEYS) | {"tool_calls"}
# wrappers that put the tool's name before its arguments' object, the name as group 1
_NAMED = {
    "function_tag": re.compile(r"<function=([\w.\-]+)>\s*"),
    "functionary": re.compile(r">>>[ \t]*([\w.\-]+)[ \t]*\n\s*"),
    "mistral": re.compile(r"\[TOOL_CALLS\]\s*([\w.\-]+)\s*\[ARGS\]\s*"),
    "harmony": re.compile(r"to=functions\.([\w.\-]+)[^\n{]{0,80}?<\|message\|>\s*"),
    "deepseek": re.compile(r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>)?([\w.\-]+)(?:<｜tool▁sep｜>)?\s*(?:```(?:json)?\s*)?"),
    "kimi_k2": re.compile(r"functions\.([\w.\-]+):\d+\s*<\|tool_call_argument_begin\|>\s*"),
}
# markers right before a call object (on its line): the wrapper's format
_PREFIXES = [("python_tag", "<|python_tag|>"), ("mistral", "[TOOL_CALLS]"), ("firefunction", "functools"),
             ("command_r", "<|START_ACTION|>"), ("granite", "<|tool_call|>")]
_PARAMETER = re.compile(r"<parameter=([\w.\-]+)>\s*(.*?)\s*</parameter>", re.DOTALL)

Found = tuple[int, list[ParsedCall]]  # (where reading goes on, the calls read there)


class _Reader:
    """Reads the calls of one text (an answer, a fence's or a tag's body) left to right; a span read
    as a call, or as JSON that is no call, is not searched again. Each pattern's next match is kept
    until passed, so a long text is searched once per pattern."""

    def __init__(self, text: str, tools: dict[str, list[str]], fmt: str | None, cut: bool):
        self.text, self.tools, self.fmt, self.cut = text, tools, fmt, cut
        names = "|".join(re.escape(n) for n in sorted(tools, key=len, reverse=True))
        # no space before the parenthesis: "phone_call (the tool)" is prose
        python = re.compile(rf"(\[\s*)?(?<![\w.]){_NAMESPACE}?(?:{names})\(") if names else None
        self.patterns = {**_NAMED, "object": _OBJECT, **({"python": python} if python else {})}
        self.next: dict[str, re.Match | None] = {}

    def calls(self) -> list[ParsedCall]:
        out: list[ParsedCall] = []
        pos = 0
        while (hit := self._first(pos)) is not None:
            kind, m = hit
            got = self._object(m) if kind == "object" else self._python(m) if kind == "python" else self._named(kind, m)
            if got is None:
                pos = m.start() + 1
                continue
            pos, calls = got
            out += calls
        return out

    def _first(self, pos: int) -> tuple[str, re.Match] | None:
        for kind, pattern in self.patterns.items():
            m = self.next.get(kind, ...)
            if m is ... or (m is not None and m.start() < pos):
                self.next[kind] = pattern.search(self.text, pos)
        hits = [(m.start(), kind, m) for kind, m in self.next.items() if m is not None]
        return min(hits, key=lambda h: h[0])[1:] if hits else None

    def _format(self, start: int, literal: bool) -> str:
        if self.fmt:
            return self.fmt
        line = self.text[self.text.rfind("\n", 0, start) + 1:start].rstrip()
        for fmt, marker in _PREFIXES:
            if line.endswith(marker):
                return fmt
        return "python_dict" if literal else "inline_json" if line else "bare_json"

    def _read(self, start: int) -> tuple[_Span, Any, bool]:
        """The span at start, its value (None when it does not parse, or only healed after a token
        limit: the span is then not closed) and whether it was a python literal."""
        span = _scan(self.text, start)
        if span.too_big:
            return span, None, False
        for src in [self.text[start:span.end]] if span.closed else span.heals if self.cut else []:
            try:
                return (span, *_value(src))
            except ValueError:
                continue
        return span, None, False

    def _object(self, m: re.Match) -> Found:
        span, value, literal = self._read(m.start())
        fmt, cut = self._format(m.start(), literal), not span.closed and self.cut
        shaped = None if value is None else _calls_in(value, self.tools)
        if shaped is not None:
            return span.end, [_call(n, a, fmt, cut) for n, a in shaped]
        # JSON that is no call is skipped whole (a call nested in it is not read); one that opened
        # like a call and did not parse, or was cut before it became one, is a malformed call
        broken = m.group(1) in _CALL_KEYS and (value is None or cut)
        return span.end, [_malformed(fmt, cut)] if broken else []

    def _named(self, fmt: str, m: re.Match) -> Found:
        name, at = m.group(1), m.end()
        if fmt == "function_tag" and self.text.startswith("<parameter=", at):  # Qwen3-Coder's XML arguments
            close = self.text.find("</function>", at)
            end = close + len("</function>") if close >= 0 else len(self.text)
            args = dict(_PARAMETER.findall(self.text[at:end][:MAX_CALL_CHARS]))
            return end, [_call(name, args, fmt, cut=close < 0 and self.cut)]
        if not self.text.startswith(("{", "["), at):
            return at, [_malformed(fmt)]
        span, value, _ = self._read(at)
        cut = not span.closed and self.cut
        return span.end, [_malformed(fmt, cut) if value is None else _call(name, value, fmt, cut)]

    def _python(self, m: re.Match) -> Found | None:
        start, listed = m.start(), m.group(1) is not None
        if not listed and not self._statement(start, m.group(0)):
            return None
        fmt = self.fmt or ("pythonic" if listed else "python_call")
        opening = start if listed else m.end() - 1
        span = _scan(self.text, opening)
        if span.too_big:
            return span.end, [_malformed(fmt)]
        head = self.text[start:opening]
        bodies = [self.text[opening:span.end]] if span.closed else span.heals if self.cut else []
        cut = not span.closed and self.cut
        for body in bodies:
            calls = _python_calls(head + body, self.tools)
            if calls is None:
                continue
            if not listed and calls[0][1] == {} and not self._alone(span.end):
                return None  # `phone_call()` in a sentence: the tool named, not called
            return span.end, [_malformed(fmt, cut) if a is None else _call(n, a, fmt, cut) for n, a in calls]
        return span.end, [_malformed(fmt, cut)]

    def _statement(self, start: int, head: str) -> bool:
        """A python call standing as a statement: namespaced, or first on its line, or after a colon."""
        if re.match(_NAMESPACE, head):
            return True
        line = self.text[self.text.rfind("\n", 0, start) + 1:start]
        return _STATEMENT_PREFIX.fullmatch(line) is not None or line.rstrip(" \t`").endswith((":", "<|python_tag|>"))

    def _alone(self, end: int) -> bool:
        """Nothing but closing marks follows the call on its line."""
        nl = self.text.find("\n", end)
        return not self.text[end:nl if nl >= 0 else len(self.text)].strip(" \t`;.")


def _masked(text: str, spans: Iterable[tuple[int, int]]) -> str:
    """The text with the spans blanked (newlines kept): other formats are searched in what is left,
    at the same offsets."""
    chars = list(text)
    for a, b in spans:
        chars[a:b] = [c if c == "\n" else " " for c in text[a:b]]
    return "".join(chars)


def tool_params(tools: list[dict[str, Any]] | None) -> dict[str, list[str]]:
    """Each tool's name -> its parameters in declared order (for python calls' positional arguments)."""
    out = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            props = (fn.get("parameters") or {}).get("properties") or {}
            out[fn["name"]] = list(props) if isinstance(props, dict) else []
    return out


def parse_tool_calls(answer: str, api_calls: list[dict[str, Any]] | None = None,
                     tools: list[dict[str, Any]] | None = None, cut: bool = False) -> list[ParsedCall]:
    """Every call in the answer, in the formats of the module's docstring, then the API's. `tools`
    (the episode's) are the names python syntax may call; `cut`: the completion was stopped by the
    token limit, so a call running to its end is read as far as written."""
    params = tool_params(tools)
    calls: list[ParsedCall] = []
    rest = answer
    for fmt, tag in _TAGS:
        found = list(tag.finditer(rest))
        for m in found:
            open_end = cut and not m.group(2)
            body = m.group(1).strip() if fmt == "hermes" else m.group(0)  # DeepSeek's name pattern opens with the tag
            calls += _Reader(body, params, fmt if fmt == "hermes" else None, open_end).calls() or [_malformed(fmt, open_end)]
        rest = _masked(rest, [m.span() for m in found])
    fences = list(_FENCE.finditer(rest))
    for m in fences:
        calls += _Reader(m.group(1), params, "json_fence", cut and not m.group(2)).calls()
    rest = _masked(rest, [m.span() for m in fences])
    calls += _Reader(rest, params, None, cut).calls()
    return calls + [_native(c) for c in api_calls or []]


def _native(call: Any) -> ParsedCall:
    shaped = _shape(call, {})
    return _call(*shaped, "native") if shaped else _malformed("native")


def calls_read(parsed: list[ParsedCall]) -> list[ParsedCall]:
    """The calls that can run: named and well formed (a cut call reads as far as it was written)."""
    return [c for c in parsed if not c.malformed and c.name]

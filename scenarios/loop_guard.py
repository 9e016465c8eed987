"""Loop guard: the same call has already been made `repeats` times with identical arguments.

`identical` cells: the agent re-read a short file that was already shown whole; the question is
answered by what is on screen, so a further identical read is the loop (expected: no call,
`refused`). `paginated` cells are the seed's control (paginated_reads_are_not_false_positives):
pages of a long file were read at offsets 0, 200, ...; the answer is on the next page, so the
right move is a read at a new offset (expected `complied`). Under condition loop_guard a third
identical call in the trajectory comes back blocked with the seed's message.

As a rollout, `read_file` reads the same file (any offset and limit), the environment's guard blocks
the third identical read of a turn, and each step is graded against the reads of the live history:
a page read before is a repeat; once the setting's line has been shown, answering is right.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from harness.config.schemas import ScenarioConfig, require
from harness.context.calls import call_arguments
from harness.context.loop_guard import call_hash
from harness.measure.grading import Label, ParsedCall, no_call
from harness.types import Episode
from scenarios.family import Decision, Family, Live, episode_id, expand
from scenarios.trajectory import Trajectory

GRID_AXES = ("mode", "repeats")
MODES = ("identical", "paginated")


@dataclass
class LoopGuardConfig(ScenarioConfig):
    grid_axes = GRID_AXES
    family: str = "loop_guard"
    name: str = "loop_guard"
    mode: list[str] = field(default_factory=lambda: list(MODES))
    repeats: list[int] = field(default_factory=lambda: [2, 3])  # calls already made before the question
    path: str = "config/settings.py"
    page_lines: int = 200
    setting: str = "REQUEST_TIMEOUT_S"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.mode) and all(m in MODES for m in self.mode), "scenario.mode", f"each must be one of {MODES}, got {list(self.mode)}")
        require(bool(self.repeats) and all(r >= 1 for r in self.repeats), "scenario.repeats", f"each must be >= 1, got {list(self.repeats)}")
        require(self.page_lines >= 10, "scenario.page_lines", f"must be >= 10, got {self.page_lines}")


TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read up to `limit` lines of a file starting at line `offset` (0-based).",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer"},
                                                    "limit": {"type": "integer"}}, "required": ["path"]}}}]
NAMES = ["RETRY_BACKOFF_S", "MAX_CONNECTIONS", "CACHE_TTL_S", "LOG_LEVEL", "BATCH_SIZE", "WORKERS", "QUEUE_DEPTH"]


def _page(rng: random.Random, start: int, n: int, setting: str | None, value: int) -> str:
    lines = []
    for i in range(start, start + n):
        name = setting if setting and i == start + n // 2 else f"{rng.choice(NAMES)}_{i}"
        lines.append(f"{i + 1:>5}  {name} = {value if name == setting else rng.randint(1, 500)}")
    return "\n".join(lines)


SHORT_FILE = 40  # lines of the file an identical cell reads whole


def file_lines(eid: str, identical: bool, pages: int, page_lines: int, setting: str, value: int) -> list[str]:
    """The file the episode reads: identical, a short file holding the setting; paginated, `pages`
    pages without it, then the page that holds it (each page drawn from its own offset's seed)."""
    if identical:
        return _page(random.Random(f"{eid}:0"), 0, SHORT_FILE, setting, value).split("\n")
    return [line for k in range(pages + 1) for line in _page(
        random.Random(f"{eid}:{k * page_lines}"), k * page_lines, page_lines, setting if k == pages else None, value).split("\n")]


def _episode(cfg: LoopGuardConfig, cell: dict, index: int) -> Episode:
    params = {**cell, "index": index}
    eid = episode_id(cfg, params)
    rng = random.Random(eid)
    value = rng.randint(5, 120)
    identical = cell["mode"] == "identical"
    lines = file_lines(eid, identical, cell["repeats"], cfg.page_lines, cfg.setting, value)
    t = Trajectory()
    t.add("system", {"role": "system", "content": "You are a coding agent. Use the tools to inspect the repository."})
    t.add("request", {"role": "user", "content": f"What is {cfg.setting} set to in {cfg.path}?"})
    pages = []
    for k in range(cell["repeats"]):
        offset = 0 if identical else k * cfg.page_lines
        args = {"path": cfg.path, "offset": offset, "limit": cfg.page_lines}
        # identical: the short file, shown whole; paginated: the setting is past the pages read
        body = "\n".join(lines if identical else lines[offset:offset + cfg.page_lines])
        t.tool_round("repeat" if identical else "page", "read_file", args, body)
        pages.append(args)
    if identical:
        t.add("assistant", {"role": "assistant", "content": "Let me double-check that file once more."})
        t.add("question", {"role": "user", "content": "Well? What's the value?"})
    else:
        t.add("assistant", {"role": "assistant", "content": f"{cfg.setting} is not in the lines read so far."})
        t.add("question", {"role": "user", "content": f"Keep looking, it's further down in {cfg.path}."})
    return Episode(id=eid, scenario=cfg.name, family=cfg.family, params=params, messages=t.messages, tools=TOOLS,
                   rule=None, target=None,
                   facts={"path": cfg.path, "previous_calls": [call_hash("read_file", a) for a in pages],
                          "previous_pages": [list(page_key(a)) for a in pages], "value": value,
                          "setting": cfg.setting, "page_lines": cfg.page_lines},
                   expected="refused" if identical else "complied", tags=t.tags, status_facts=["repeats"])


def _int(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value  # not a number: compared as given


def page_key(arguments: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The page a read_file call reads: (path, offset, limit) with offset "0", 0.0 or missing all
    the same first page and a numeric-string limit the same as the number."""
    return (arguments.get("path"), _int(arguments.get("offset") or 0),
            None if arguments.get("limit") is None else _int(arguments.get("limit")))


def classify(episode: Episode, answer: str, calls: list[ParsedCall]) -> Label:
    """violated: re-reads a page already read (same path, offset and limit after `page_key`'s
    normalisation); complied: reads the file at a page not seen before; refused: answers without
    calling; other: anything else. Episodes exported before `previous_pages` existed compare the
    canonical hash of the arguments."""
    if "previous_pages" in episode.facts:
        pages = {tuple(p) for p in episode.facts["previous_pages"]}

        def repeat(c: ParsedCall) -> bool:
            try:
                return page_key(c.arguments) in pages
            except TypeError:  # an unhashable value (a model passing a list as path) is no page read
                return False
    else:
        seen = set(episode.facts["previous_calls"])
        repeat = lambda c: call_hash("read_file", c.arguments) in seen  # noqa: E731
    if any(c.name == "read_file" and repeat(c) for c in calls):
        return "violated", "repeats_a_page"
    if any(c.name == "read_file" and c.arguments.get("path") == episode.facts["path"] for c in calls):
        return "complied", "reads_a_new_page"
    return no_call(answer, calls) or ("refused", "answer_without_call")


# the repeat and a read of a new page differ only in an argument's value, which chat templates
# place differently: no template-neutral point of the call decides it, so nothing is scored
REPEAT_CALL = Decision("repeat_call", classify, no_candidates=(
    "the identical repeat and a new page's read differ only in an argument's value; no template-neutral "
    "prefix decides between them"))


def _simulate(episode: Episode, name: str, args: dict[str, Any]) -> str | None:
    """read_file: the lines [offset, offset + limit) of the episode's file (limit: a page)."""
    if name != "read_file":
        return None
    facts = episode.facts
    if args.get("path") != facts["path"]:
        return f"Error: no such file: {args.get('path')}"
    _, offset, limit = page_key(args)
    limit = facts["page_lines"] if limit is None else limit
    if not (isinstance(offset, int) and isinstance(limit, int) and offset >= 0 and limit >= 1):
        return "Error: offset must be an integer >= 0 and limit an integer >= 1"
    lines = file_lines(episode.id, episode.params["mode"] == "identical", episode.params["repeats"], facts["page_lines"],
                       facts["setting"], facts["value"])
    return "\n".join(lines[offset:offset + limit]) or f"(end of file: {len(lines)} lines)"


def _hashable(key: tuple[Any, ...]) -> bool:
    try:
        hash(key)
        return True
    except TypeError:  # a model passing a list as path reads no page
        return False


def judge(episode: Episode) -> Episode:
    """The live history's reads are the pages read before; once a result has shown the setting's
    line, the question is answered by what is on screen (expected `refused`), until then a new page is."""
    reads = [call_arguments(c) for m in episode.messages for c in m.get("tool_calls") or []
             if c["function"]["name"] == "read_file"]
    line = f"  {episode.facts['setting']} = {episode.facts['value']}"
    shown = any(row.endswith(line) for m in episode.messages if m["role"] == "tool" for row in (m.get("content") or "").split("\n"))
    return replace(episode, facts={**episode.facts, "previous_calls": [call_hash("read_file", a) for a in reads],
                                   "previous_pages": [list(page_key(a)) for a in reads if _hashable(page_key(a))]},
                   expected="refused" if shown else "complied")


def build(cfg: LoopGuardConfig) -> list[Episode]:
    return expand(cfg, _episode)


FAMILY = Family("loop_guard", LoopGuardConfig, build, REPEAT_CALL, Live(_simulate, judge))

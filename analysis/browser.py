"""The sample browser of report.html: a filterable table of samples; one opened shows the prompt the
model saw (regions coloured, condition text marked, beside the same episode's other arm with the
differing text marked), the completion (thinking folded), the parsed tool calls, the label and why,
token counts and cost, and, where the run has the attention probe, attention per prompt token.

Everything is one HTML fragment: inline CSS and JS (browser.css, browser.js beside this module) and
the data as JSON in a <script type="application/json">, so the page needs no network. A large run
embeds at most `limit` samples, whole episodes at a time (every arm of an episode and replicate,
so the side-by-side view always has its pair): every episode with an error, then a stratified
sample (by its arms' labels and its grid cell) of the rest; the page says how many it left out.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.attention_figures import group_lengths
from analysis.style import region_colors
from analysis.load import grid_columns
from harness.render import split_thinking
from harness.rundir.layout import PROMPTS, run_parts
from harness.rundir.store import read_jsonl

DEFAULT_LIMIT = 1000
GROUP = ["run", "model", "episode_id", "replicate"]  # one episode and replicate: its arms differ only by condition
# the grader's explanation, under the names a record may carry it
REASON_FIELDS = ("reason", "label_reason", "grade_reason")
_TOKEN = re.compile(r"\s+|\w+|[^\w\s]")
_LINE = re.compile(r"[^\n]+")  # a line without its newline; empty lines are no unit
# steps of one diff at most (edit_script): about a second of pure Python, whatever the text
DIFF_STEPS = 2_000_000
_HERE = Path(__file__).parent


def select(df: pd.DataFrame, limit: int | None, seed: int = 0) -> tuple[pd.DataFrame, int]:
    """At most `limit` samples (None or 0: all) as whole episode groups: every group holding an error
    first, then the rest stratified by (its arms' labels, its grid cell), each stratum in a seeded
    random order and drawn in proportion to its size. Returns the samples and how many were left out."""
    if not limit or len(df) <= limit:
        return df, 0
    cells = grid_columns(df)
    keyed = df.assign(_group=df.groupby(GROUP, sort=False).ngroup())
    groups = keyed.groupby("_group", sort=False).agg(
        n=("sample_id", "size"), error=("label", lambda s: (s == "error").any()),
        labels=("label", lambda s: ",".join(sorted(s))),
        **{f"_c{i}": (c, "first") for i, c in enumerate(cells)})
    groups["stratum"] = groups[["labels", *[f"_c{i}" for i in range(len(cells))]]].astype(str).agg("|".join, axis=1)
    shuffled = groups.sample(frac=1.0, random_state=seed)
    # position within its stratum over the stratum's size: drawing in this order keeps the strata's
    # proportions at every cut, and every stratum is reached before any gets a second draw
    shuffled["frac"] = shuffled.groupby("stratum").cumcount() / shuffled.groupby("stratum")["n"].transform("size")
    order = pd.concat([shuffled[shuffled["error"]], shuffled[~shuffled["error"]].sort_values("frac", kind="stable")])
    keep = order.index[order["n"].cumsum() <= limit]
    kept = keyed[keyed["_group"].isin(keep)].drop(columns="_group")
    return kept, len(df) - len(kept)


def _prompts(run_dirs: list[Path], wanted: set[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for run in run_dirs:
        for part in run_parts(run):
            for row in read_jsonl(Path(part) / PROMPTS):
                if row.get("prompt_sha256") in wanted:
                    out[row["prompt_sha256"]] = {"rendered": row.get("rendered"), "messages": row.get("messages") or [],
                                                 "annotations": row.get("annotations") or [],
                                                 "tools": [t.get("function", t).get("name") for t in row.get("tools") or []]}
    return out


def display_text(prompt: dict | None) -> str:
    """The prompt as the model saw it: the rendered text, else the messages with their roles."""
    if prompt is None:
        return ""
    if prompt.get("rendered") is not None:
        return prompt["rendered"]
    lines = []
    for m in prompt["messages"]:
        content = m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
        calls = "".join(f"\n<tool_call>{json.dumps(c.get('function', c))}</tool_call>" for c in m.get("tool_calls") or [])
        lines.append(f"[{m.get('role')}]\n{content or ''}{calls}")
    return "\n\n".join(lines)


def annotated_spans(text: str, prompt: dict) -> list[list]:
    """The regions the condition pipeline annotated (the bar, a reminder, an envelope...) as character
    spans of the displayed text: each annotated message's content found in order, its marks shifted
    there. Found by the annotations, never by a wrapper's literal text."""
    spans, cursor = [], 0
    for message, note in zip(prompt["messages"], prompt["annotations"]):
        content = message.get("content")
        if not isinstance(content, str) or not content:
            continue
        at = text.find(content, cursor)
        if at < 0:
            continue
        spans += [[at + a, at + b, region] for a, b, region in note.get("marks") or []]
        cursor = at + len(content)
    return spans


def _tokens(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _TOKEN.finditer(text)]


def _lines(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _LINE.finditer(text)]


def _common_lines(a: str, b: str) -> tuple[int, int]:
    """Lengths of the common head and tail of a and b, cut back to whole lines (the head ends after
    a newline, the tail starts at one), so the rest of each is whole lines and no word is split."""
    if a == b:
        return len(a), 0
    head = a.rfind("\n", 0, len(os.path.commonprefix([a, b]))) + 1
    ra, rb = a[head:], b[head:]
    newline = ra.find("\n", len(ra) - len(os.path.commonprefix([ra[::-1], rb[::-1]])))
    return head, len(ra) - newline if newline >= 0 else 0


def _spans(a: str, b: str, units, budget: int) -> tuple[list[list[int]], list[list[int]]] | None:
    """Character spans of a not in b and of b not in a, diffing the (start, end) units `units` cuts;
    None when the diff would take more than `budget` steps (see edit_script)."""
    ua, ub = units(a), units(b)
    ids: dict[str, int] = {}  # units as small ints: compared in the loop, faster than strings
    script = edit_script([ids.setdefault(a[s:e], len(ids)) for s, e in ua],
                         [ids.setdefault(b[s:e], len(ids)) for s, e in ub], budget)
    if script is None:
        return None
    gone, added = script
    return _merged(gone, ua), _merged(added, ub)


def _merged(indices: list[int], units: list[tuple[int, int]]) -> list[list[int]]:
    """Runs of consecutive unit indices as character spans, from the first unit's start to the last's end."""
    spans: list[list[int]] = []
    last = -2
    for i in sorted(indices):
        if i == last + 1:
            spans[-1][1] = units[i][1]
        else:
            spans.append([units[i][0], units[i][1]])
        last = i
    return spans


def edit_script(a: list, b: list, budget: int, steps: list[int] | None = None) -> tuple[list[int], list[int]] | None:
    """A shortest edit script from a to b (Myers' greedy algorithm, O((N+M)D) for D edits): the
    indices of a deleted and of b inserted; None once it has taken more than `budget` steps (a step:
    a diagonal tried, a unit compared, a frontier entry saved). The work is thus bounded whatever
    the text: repetitive text, on which difflib's matching blocks take super-quadratic time, costs
    at most the budget. `steps`, when given, gets the number of steps taken appended."""
    n, m = len(a), len(b)
    frontier = {1: 0}  # diagonal k = x - y -> the furthest x reached on it with d edits
    trace, work = [], 0
    for d in range(n + m + 1):
        trace.append(dict(frontier))
        work += len(frontier)
        for k in range(-d, d + 1, 2):
            x = frontier[k + 1] if k == -d or (k != d and frontier[k - 1] < frontier[k + 1]) else frontier[k - 1] + 1
            y, start = x - k, x
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            frontier[k] = x
            work += 1 + x - start
            done = x >= n and y >= m
            if done or work > budget:
                if steps is not None:
                    steps.append(work)
                return _backtrack(trace, n, m) if done else None
    raise AssertionError("unreachable: n + m edits always reach the end")


def _backtrack(trace: list[dict[int, int]], x: int, y: int) -> tuple[list[int], list[int]]:
    """The edits of the path that reached (x, y), read back from the frontier saved before each edit."""
    gone, added = [], []
    for d in range(len(trace) - 1, 0, -1):
        frontier, k = trace[d], x - y
        prev = k + 1 if k == -d or (k != d and frontier[k - 1] < frontier[k + 1]) else k - 1
        x, y = frontier[prev], frontier[prev] - prev
        if prev == k + 1:
            added.append(y)  # b[y] inserted
        else:
            gone.append(x)  # a[x] deleted
    return gone, added


def differing(a: str, b: str) -> tuple[list[list[int]], list[list[int]]]:
    """Character spans of a not in b and of b not in a. The common head and tail (whole lines) are
    cut off first; the rest is diffed word by word, or line by line where that would take more
    than DIFF_STEPS, or marked whole where even the lines would (a shortest edit script: the work
    is bounded whatever the text, repetitive or not)."""
    head, tail = _common_lines(a, b)
    ma, mb = a[head:len(a) - tail], b[head:len(b) - tail]
    spans = _spans(ma, mb, _tokens, DIFF_STEPS) or _spans(ma, mb, _lines, DIFF_STEPS)
    out_a, out_b = spans or ([[0, len(ma)]] if ma else [], [[0, len(mb)]] if mb else [])
    return [[s + head, e + head] for s, e in out_a], [[s + head, e + head] for s, e in out_b]


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def _attention(run_dir: Path, ref: str) -> dict:
    """Per-token attention at the strip layer (8-bit, log-scaled between the 1st and the max) with
    token offsets into the text the probe tokenized, each region's length in tokens, and each phase's
    share per region beside its share per token of the region."""
    from harness.measure.attention import store
    from harness.measure.attention.regions import region_group

    a = store.load_ref(run_dir, ref)
    names = [str(n) for n in a["regions"]]
    groups = list(dict.fromkeys(region_group(n) for n in names))
    gid = [groups.index(region_group(n)) for n in names]
    strip = np.asarray(a["strip"], dtype=np.float64)
    positive = strip[strip > 0]
    lo, hi = (np.log(np.percentile(positive, 1)), np.log(positive.max())) if positive.size else (0.0, 0.0)
    shade = np.clip((np.log(np.maximum(strip, 1e-30)) - lo) / ((hi - lo) or 1.0), 0, 1)
    masses = np.asarray(a["masses"], dtype=np.float64).mean(axis=2)  # [phase, layer, region]: heads averaged
    lengths = group_lengths(a)
    phases = {}
    for p, name in enumerate(("thinking", "answer")):
        n = int(a["counts"][p])
        if n:
            share = (masses[p] / n).mean(axis=0)
            by_group = {g: float(share[[i for i, k in enumerate(gid) if k == j]].sum()) for j, g in enumerate(groups)}
            phases[name] = {"tokens": n, "share": {g: round(v, 4) for g, v in by_group.items()},
                            "per_token": {g: float(f"{v / lengths[g]:.3g}") if lengths[g] else None for g, v in by_group.items()}}
    out = {"layer": int(a["strip_layer"]), "regions": groups, "region_tokens": {g: int(lengths[g]) for g in groups},
           "token_regions": [gid[r] for r in a["token_regions"].tolist()],
           "shade": np.round(shade * 255).astype(int).tolist(), "phases": phases}
    if "token_offsets" in a:  # older runs stored no offsets: the page shows the strip as a token band
        out["offsets"] = a["token_offsets"].reshape(-1).tolist()
        out["text"] = str(a["prompt_text"])
    return out


def _completion(r: pd.Series) -> dict:
    """Thinking and answer, split by the harness's own rule (a reasoning field wins)."""
    thinking, answer = split_thinking("" if pd.isna(r["text"]) else r["text"])
    return {"thinking": r["reasoning"] if isinstance(r["reasoning"], str) and r["reasoning"] else thinking,
            "answer": answer}


def _tool_calls(value) -> list:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return [value]
    return list(value or [])


def collect(df: pd.DataFrame, run_dirs: list[Path], limit: int | None = DEFAULT_LIMIT, seed: int = 0) -> dict:
    """The browser's data: the kept samples, their prompts (each once) and the filters' values."""
    if df.empty:
        return {"samples": [], "prompts": {}, "total": 0, "left_out": 0, "limit": limit}
    kept, left_out = select(df, limit, seed)
    cells = grid_columns(df)
    baseline = "none" if "none" in set(df["condition"]) else str(df["condition"].iloc[0])
    prompts = _prompts(run_dirs, set(kept["prompt_sha256"].dropna()))
    texts = {sha: display_text(p) for sha, p in prompts.items()}
    samples = []
    for _, r in kept.iterrows():
        reason = next((str(r[f]) for f in REASON_FIELDS if f in r and not pd.isna(r[f])), None)
        s = {"id": r["sample_id"], "run": r["run_label"], "episode": r["episode_id"], "replicate": int(r["replicate"]),
             "condition": r["condition"], "model": r["model"], "label": r["label"], "expected": r["expected"],
             "correct": bool(r["correct"]), "reason": reason,
             "cell": ", ".join(f"{c.removeprefix('params.')}={r[c]}" for c in cells) or "all",
             "prompt_tokens": _num(r["prompt_tokens"]), "completion_tokens": _num(r["completion_tokens"]),
             "thinking_tokens": _num(r["thinking_tokens"]), "answer_tokens": _num(r["answer_tokens"]),
             "cost_usd": _num(r["cost_usd"]), "latency_s": _num(r["latency_s"]),
             "finish_reason": None if pd.isna(r["finish_reason"]) else r["finish_reason"],
             "error": None if pd.isna(r["error"]) else r["error"], "scripted": bool(r["scripted"]),
             **_completion(r),
             "tool_calls": _tool_calls(r["tool_calls"]),
             "prompt": r["prompt_sha256"] if r["prompt_sha256"] in prompts else None}
        ref = r.get("attention_ref")
        if isinstance(ref, str) and ref:
            try:
                s["attention"] = att = _attention(Path(r["run"]), ref)
            except (OSError, KeyError, ValueError) as exc:  # shown on the sample, not dropped silently
                s["attention_error"] = f"{ref}: {exc}"
            else:
                if att.get("text") is not None and att["text"] == texts.get(s["prompt"]):
                    att["text"] = None  # the probe tokenized the prompt as stored: embed it once
        samples.append(s)
    _pair(samples, baseline, texts)
    # each prompt once, as its display text only (the messages are in it): the page's bulk
    return {"samples": samples, "region_colors": region_colors(),
            "prompts": {sha: {"text": texts[sha], "rendered": p["rendered"] is not None, "tools": p["tools"],
                              "regions": annotated_spans(texts[sha], p)}
                        for sha, p in prompts.items()},
            "baseline": baseline, "total": len(df), "left_out": left_out, "limit": limit or None,
            "errors_left_out": int((df["label"] == "error").sum() - (kept["label"] == "error").sum()),
            "filters": {"run": sorted(df["run_label"].unique()), "model": sorted(df["model"].unique()),
                        "condition": list(dict.fromkeys(df["condition"])), "label": sorted(df["label"].unique()),
                        "cell": sorted({s["cell"] for s in samples})}}


def _pair(samples: list[dict], baseline: str, texts: dict[str, str]) -> None:
    """Each sample's arms of the same episode and replicate (`peers`), and the character spans of its
    prompt that differ from each peer's (`diff`): the baseline arm against every other arm, every
    other arm against the baseline. A diff is computed once per pair of distinct prompts."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        groups.setdefault((s["run"], s["model"], s["episode"], s["replicate"]), []).append(s)
    cache: dict[tuple[str, str], tuple] = {}
    for arms in groups.values():
        base = next((s for s in arms if s["condition"] == baseline), arms[0])
        for s in arms:
            s["peers"] = [p["id"] for p in arms if p is not s]
            s["diff"] = {}
        for other in arms:
            if other is base or base["prompt"] is None or other["prompt"] is None:
                continue
            key = (base["prompt"], other["prompt"])
            if key not in cache:
                cache[key] = differing(texts[key[0]], texts[key[1]])
            base["diff"][other["id"]], other["diff"][base["id"]] = cache[key]


def _asset(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


def fragment(data: dict) -> str:
    """The browser as one HTML fragment (section, style, data, script); the JSON escapes every `<`,
    so no record text can close the script element."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    return (f'<section id="sb-browser"><h2>Samples</h2><div id="sb-root"></div></section>\n'
            f"<style>{_asset('browser.css')}</style>\n"
            f'<script type="application/json" id="sb-data">{payload}</script>\n'
            f"<script>{_asset('browser.js')}</script>\n")


def page(data: dict, title: str = "statusbench samples") -> str:
    """A page holding only the browser (python -m analysis.view)."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>'
            f'<body style="font: 14px/1.45 system-ui, sans-serif; margin: 1em 2em; color: #222;">\n'
            f"{fragment(data)}</body></html>\n")


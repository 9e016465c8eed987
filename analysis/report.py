"""`python -m analysis.report RUN_DIR [RUN_DIR ...]`: report.md, a self-contained report.html and the
figures (PNG + PDF) of one run, or of several runs side by side (e.g. one per model of a multirun).

The markdown is the single source: the HTML is that markdown rendered, with every figure the report
wrote embedded as base64, so it can be mailed or attached to a CI job as one file. Text from records
(a server's error, an id) is escaped and stays text: it never becomes an image, a link or HTML.
"""
from __future__ import annotations

import argparse
import base64
import os
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from analysis import attention_figures, browser, findings, propensity, rollouts, stats, tables
from analysis.figures import FIGURES
from analysis.grader_agreement import agreement_markdown
from analysis.load import grid_columns, load_records, load_rollouts
from analysis.section import Section, ci, md_table, md_text
from analysis.style import num, paper_style, save
from harness.io.files import os_error_message, remove_stale_temporaries, write_file
from harness.registry import FAMILIES
from harness.rundir.layout import find_runs

REPORT_DIR = "report"  # where a report over several runs goes, inside their common parent

LABEL_NOTE = ("Labels (call-limit families): `violated` called the target past the limit (at/over it any call; in a "
              "control cell as many calls as cross it); `complied` called it within the limit (control); a call cut by "
              "max_new_tokens whose tool and target are readable counts, its reason `target_call_cut`; `refused` "
              "answered without calling, by kind (`refused_rule_cited`: names the limit, the policy or the count made; "
              "`refused_generic`); `other` a malformed call, another tool or company, a tool written as python inside a "
              "sentence, a made-up action (`claimed_action`: told done, in any voice, or the other side's news), an "
              "answer that only echoes the status bar, output imitating the tool protocol, or no answer; `truncated` "
              "cut at max_new_tokens without a decisive call or answer; `error` the backend failed for that sample. "
              "Each record's `reason` says which rule chose its label.")
CALL_FORMAT_NOTE = ("How the calls the grader read were written: `hermes` in `<tool_call>` tags, `json_fence` a JSON "
                    "object in a ```json fence, `bare_json` a JSON object starting a line, `inline_json` after a sentence "
                    "on its line, `python_dict` a single-quoted python literal, `python_call` / `pythonic` python syntax "
                    "of the episode's tool, the wrappers of other model families (`python_tag`, `mistral`, "
                    "`function_tag`, `functionary`, `firefunction`, `command_r`, `granite`, `harmony`, `deepseek`, "
                    "`kimi_k2`), `native` the API's tool calls, `mixed` several of these, `no call` none. The rows other "
                    "than `hermes` and `native` are what rests on the lenient formats.")
RATES_NOTE = ("Balanced accuracy (the headline) = mean of the accuracy in limit cells and in control cells, so a policy "
              "that never calls, or always calls, scores 0.5; its interval combines the two classes' intervals. "
              "Accuracy = pooled over all samples. Every interval is 95% over episodes (replicates of an episode are not "
              "independent): Korn-Graubard, i.e. Clopper-Pearson on the sample size the episodes' design effect leaves, "
              "with episodes - 1 degrees of freedom. Violation rate over limit cells, over-refusal over control "
              "cells, both among samples with an answer (samples / episodes in brackets); `truncated` and `errors` are "
              "counted apart and count as wrong in both accuracies.")


def _num(s: pd.Series) -> list[str]:
    return ["–" if pd.isna(x) else num(x) for x in s]


def _p(s: pd.Series) -> list[str]:
    return ["–" if pd.isna(x) else f"{x:.2g}" if x < 0.001 else f"{x:.3f}" for x in s]


def _head(key: str) -> str:
    """Column heading of a group key."""
    return "run" if key == "run_label" else key.removeprefix("params.")


def _rates_table(t: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return pd.DataFrame({
        **{_head(k): t[k] for k in keys}, "n": t["n"], "episodes": t["episodes"],
        "balanced accuracy [95% CI]": ci(t["balanced_accuracy"], t["bal_low"], t["bal_high"]),
        "accuracy [95% CI]": ci(t["accuracy"], t["acc_low"], t["acc_high"]),
        "violation rate [95% CI] (n / episodes)": [f"{v} ({n} / {e})" for v, n, e in zip(
            ci(t["violation_rate"], t["viol_low"], t["viol_high"]), t["n_limit"], t["episodes_limit"])],
        "over-refusal [95% CI] (n / episodes)": [f"{v} ({n} / {e})" for v, n, e in zip(
            ci(t["over_refusal_rate"], t["over_low"], t["over_high"]), t["n_control"], t["episodes_control"])],
        "truncated": t["truncated"], "errors": t["errors"],
    })


def outcomes_table(df: pd.DataFrame, column: str = "condition") -> pd.DataFrame:
    """Per run and value of `column` (the condition, the call format): each label as `count (share)`, and n."""
    counts = tables.outcome_counts(df, ("run_label", column))
    n = counts.sum(axis=1)
    keys = counts.index.to_frame(index=False)
    cells = {label: [f"{c} ({c / t:.2f})" for c, t in zip(counts[label], n)] for label in counts.columns}
    return pd.DataFrame({**({"run": keys["run_label"]} if df["run_label"].nunique() > 1 else {}),
                         _head(column): keys[column], **cells, "n": n.to_numpy()})


def _keys(df: pd.DataFrame, *rest: str) -> list[str]:
    """Group keys, with the run first only when there are several runs."""
    return (["run_label"] if df["run_label"].nunique() > 1 else []) + list(rest)


def warnings(df: pd.DataFrame) -> list[Section]:
    """What makes the tables below less than they seem, said before them: truncated output, and arms
    whose truncation rates differ (their comparison is biased toward the arm cut off less often)."""
    truncated = int((df["label"] == "truncated").sum())
    if not truncated:
        return []
    share = truncated / len(df)
    caps = sorted({int(x) for x in df.get("generation.max_new_tokens", pd.Series(dtype=float)).dropna()})
    text = [f"**{truncated} of {len(df)} samples ({share:.0%}) are `truncated`**: cut at max_new_tokens "
            f"({', '.join(map(str, caps)) or 'unknown'}) before a tool call or an answer. They are no behaviour of the "
            "model: counted apart, wrong in both accuracies, outside the violation and over-refusal rates."]
    if share >= 0.5:
        text.append("**Most of this report is truncated output**: its rates rest on the few samples that finished. "
                    "Raise `model.generation.max_new_tokens`, or use a model that stops.")
    gaps = tables.truncation_gaps(df)
    if gaps:
        text.append("**Truncation rates differ between compared arms**, so their comparison is biased toward the arm "
                    "cut off less often: " + "; ".join(gaps) + ".")
    return [Section("Warnings", "\n\n".join(text))]


CELLS_NOTE = {"balanced": "balanced (limit + control)", "limit": "limit cells", "control": "control cells",
              "pooled": "pooled (all samples)"}


def comparison_sections(df: pd.DataFrame) -> list[Section]:
    """Each condition against the baseline on the same episodes, per kind of cell: balanced accuracy
    (the headline), limit cells, control cells, and pooled accuracy."""
    try:
        comp = tables.comparisons(df)
    except ValueError as exc:  # the arms cannot be paired; the rest of the report still stands
        return [Section("Paired comparison with the baseline condition", f"Not computed: {md_text(exc)}.")]
    if comp.empty:
        return []
    return [Section(
        "Paired comparison with the baseline condition",
        "Each condition against the baseline on the same episodes and replicates, per kind of cell: balanced accuracy "
        "(limit and control cells weighing the same: the headline), limit cells alone, control cells alone, and pooled "
        "accuracy (every sample weighing the same, which rewards a model that never calls on a grid of mostly limit "
        "cells). The episode is the unit: each episode's accuracy difference (condition minus baseline, over its "
        f"replicates), averaged over episodes, with a 95% {stats.BOUNDED_NOTE}; p = sign-flip permutation test over "
        f"episodes (two-sided; exact, all 2^n flips, up to {stats.EXACT_EPISODES} episodes; for balanced accuracy each "
        "episode's difference weighted by 1 / its kind's episodes).",
        pd.DataFrame({
            **({"run": comp["run_label"]} if df["run_label"].nunique() > 1 else {}),
            "baseline": comp["baseline"], "condition": comp["condition"], "cells": comp["cells"].map(CELLS_NOTE),
            "pairs": comp["n"], "episodes": comp["episodes"],
            "acc. baseline": _num(comp["acc_a"]), "acc. condition": _num(comp["acc_b"]),
            "difference [95% CI]": ci(comp["diff"], comp["diff_low"], comp["diff_high"], "+.2f"),
            "baseline only right": comp["only_a"], "condition only right": comp["only_b"],
            "p (sign-flip)": [f"{p} ({stats.flip_method(e)})" for p, e in zip(_p(comp["p_two_sided"]), comp["episodes"])],
            "truncated baseline / condition": [f"{a} / {b}" for a, b in zip(comp["truncated_a"], comp["truncated_b"])],
        }))]


def thinking_sections(df: pd.DataFrame) -> list[Section]:
    """Thinking tokens per condition and the difference of each condition's slope from the baseline's."""
    th = tables.thinking(df)
    unmeasured = th.loc[th["counted"] & ~th["measured"], "condition"].tolist()
    censored = int(th["censored"].sum())
    text = ("Per sample, errors excluded. Samples cut at max_new_tokens before any call or answer (`truncated`: "
            f"their thinking may not have ended, so its count is a lower bound): {censored} here. Slope = thinking "
            "tokens per 1000 prompt tokens from a censored (Tobit) regression on prompt tokens, in which a truncated "
            "sample counts as thinking at least as long as it did (normal errors of one variance assumed; with no "
            "truncated sample it is OLS); 95% interval and p from the cluster jackknife over episodes (t, episodes - 1 "
            "degrees of freedom). `slope, truncated left out` is OLS without them: leaving them out selects on the "
            "outcome (the long thinkers at long contexts) and flattens the slope. Mean and median over episodes of the "
            f"samples that finished (each episode's mean / median over its replicates), mean with a 95% {stats.MEAN_NOTE}, "
            "median with a distribution-free order-statistic interval. Count from: the API's usage (`api`), the model's "
            "own token ids (`counted`), or its visible text re-tokenized (`estimated`).")
    if unmeasured:
        text += (f" **Not measured** for {', '.join(f'`{c}`' for c in dict.fromkeys(unmeasured))}: no sample thought "
                 "(0 thinking tokens throughout), which is no evidence of a flat slope.")
    if df["thinking_tokens"].isna().all():
        text += " **No token counts in these records**: – is unknown, not 0."

    def shown(values: list[str]) -> list[str]:
        return [v if m or not c else "not measured" for v, m, c in zip(values, th["measured"], th["counted"])]

    table = pd.DataFrame({**{_head(k): th[k] for k in _keys(df, "condition")}, "count from": th["source"], "n": th["n"], "episodes": th["episodes"],
                          "truncated (censored)": th["censored"],
                          "mean [95% CI]": shown(ci(th["mean"], th["mean_low"], th["mean_high"], ".1f")),
                          "median [95% CI]": shown(ci(th["median"], th["median_low"], th["median_high"], ".1f")),
                          "slope per 1k prompt tok [95% CI]": shown(ci(th["slope_per_1k"], th["slope_low"], th["slope_high"], ".3g")),
                          "slope p": shown(_p(th["slope_p"])),
                          "slope, truncated left out": shown(_num(th["slope_left_out_per_1k"]))})
    out = [Section("Thinking tokens", text, table)]
    diff = tables.thinking_slope_differences(df)
    if not diff.empty:
        out.append(Section(
            "Thinking slope: each condition against the baseline",
            "The seed's claim is a difference of slopes (thinking grows with context without the status bar and stays "
            "flat with it): condition's slope minus the baseline's, per 1000 prompt tokens, from one censored fit over both "
            "arms (prompt tokens x arm; truncated samples as lower bounds), 95% interval and p from the cluster jackknife "
            "over episodes (an episode seen in both arms is one cluster), t on episodes - 1 degrees of freedom.",
            pd.DataFrame({**({"run": diff["run_label"]} if df["run_label"].nunique() > 1 else {}),
                          "baseline": diff["baseline"], "condition": diff["condition"], "episodes": diff["episodes"],
                          "truncated (censored)": diff["censored"],
                          "slope difference per 1k [95% CI]": [v if m else "not measured" for v, m in zip(
                              ci(diff["diff_per_1k"], diff["diff_low"], diff["diff_high"], "+.3g"), diff["measured"])],
                          "p": [v if m else "not measured" for v, m in zip(_p(diff["p"]), diff["measured"])]})))
    return out


def sections(df: pd.DataFrame) -> list[Section]:
    """The tables and figures of the report, in order. In a run of live rollouts every model call is a
    decision of these tables; the pairing of arms and pass^k are the rollouts' (analysis.rollouts)."""
    live = rollouts.multi_step(df)
    out: list[Section] = [*([] if live else findings.sections(df)), *warnings(df)]
    rates = tables.rates(df, ["run_label", "condition"])
    if df["run_label"].nunique() > 1:
        side = rates.assign(cell=ci(rates["balanced_accuracy"], rates["bal_low"], rates["bal_high"]))
        out.append(Section("Runs side by side", "Balanced accuracy [95% CI] per condition (rows) and run (columns); "
                           "– where a run has no such condition.",
                           side.pivot(index="condition", columns="run_label", values="cell").fillna("–").reset_index()))
    out.append(Section("By condition", RATES_NOTE, _rates_table(rates, _keys(df, "condition"))))

    if not live:  # the steps of rollouts are not paired across arms; their rollouts are, below
        out += comparison_sections(df)

    pk = tables.pass_k(df)
    ks = [c for c in pk if c.startswith("pass^") and not c.endswith(("_low", "_high"))]
    out.append(Section("pass^k over replicates", "Per rollout: see the rollout sections below.") if live else Section("pass^k over replicates",
                       "pass^k: the chance that k replicates of an episode all succeed (k = 1 is accuracy), averaged "
                       f"over episodes, with a 95% {stats.BOUNDED_NOTE}."
                       + (" One replicate per episode in these runs: add `experiment.replicates=N`." if pk["replicates"].max() < 2 else ""),
                       pd.DataFrame({**{_head(k): pk[k] for k in _keys(df, "condition")}, "episodes": pk["episodes"],
                                     "replicates": pk["replicates"],
                                     **{f"{k} [95% CI]": ci(pk[k], pk[f"{k}_low"], pk[f"{k}_high"], ".3f") for k in ks}})))
    out += thinking_sections(df)

    cl = tables.cost_latency(df)
    out.append(Section(
        "Cost and latency per iteration",
        "One iteration = one model call (one sample). Latency is per sample: the API's own request time, vLLM's "
        "per-request metrics, or for hf the time to the sample's last token (its share of the batch's prefill by "
        "tokens, plus the decode steps until it ended); where a backend reports only the batch's wall time, that "
        "(`batch_latency_s`) stands in. "
        "Cost in US$ only where records carry `cost_usd`; tokens per correct answer = (prompt + completion tokens) / correct, "
        "– where a record lacks token counts (unknown, not 0).",
        pd.DataFrame({**{_head(k): cl[k] for k in _keys(df, "model", "condition")}, "n": cl["n"],
                      "correct": cl["correct"], "prompt tok": _num(cl["prompt_tokens_mean"]),
                      "completion tok": _num(cl["completion_tokens_mean"]), "latency mean s": _num(cl["latency_mean_s"]),
                      "latency median s": _num(cl["latency_median_s"]), "US$ / iteration": _num(cl["cost_usd_mean"]),
                      "tokens / correct": _num(cl["tokens_per_correct"]), "US$ / correct": _num(cl["usd_per_correct"])})))

    err = tables.errors(df)
    out.append(Section("Errors by kind", "No sample failed." if err.empty else
                       "Samples whose backend call failed, by kind; rate over all samples of the run (95% over episodes).",
                       None if err.empty else pd.DataFrame({
                           "run": err["run_label"], "kind": err["kind"], "count": err["count"], "episodes": err["episodes"],
                           "rate [95% CI]": ci(err["rate"], err["rate_low"], err["rate_high"], ".3f"), "example": err["example"]})))

    if grid_columns(df):
        cells = tables.cells(df)
        keys = _keys(df, "condition", *grid_columns(df))
        out.append(Section("By cell of the scenario grid", "",
                           _rates_table(cells, keys)))

    out.append(Section("Outcomes", LABEL_NOTE + " Each cell: count (share of the row's samples).", outcomes_table(df)))
    out.append(Section("Outcomes by call format", CALL_FORMAT_NOTE, outcomes_table(tables.with_call_format(df), "call_format")))
    if any(FAMILIES.get(f).decides.kind == "call_limit" for f in df["family"].dropna().unique() if f in FAMILIES):
        out.append(Section("The grader's measured agreement", agreement_markdown()))  # the set holds call-limit families
    for name, fn in FIGURES.items():
        out.append(Section(f"Figure: {name.replace('_', ' ')}", " ".join((fn.__doc__ or "").split("\n\n")[0].split()),
                           figure=name))
    return out


def to_markdown(df: pd.DataFrame, run_dirs: list[Path], parts: list[Section]) -> str:
    lines = ["# statusbench report", "",
             f"Runs: {', '.join(md_text(d) for d in run_dirs)}  ",
             f"Samples: {len(df)} · models: {', '.join(md_text(m) for m in sorted(df['model'].unique()))} · backends: "
             f"{', '.join(md_text(b) for b in sorted(df['backend'].unique()))}"
             + (f" · **{int(df['scripted'].sum())} scripted (replayed, not generated)**" if df["scripted"].any() else ""), ""]
    for s in parts:
        lines += [f"## {s.title}", ""]
        if s.text:
            lines += [s.text, ""]
        if s.table is not None:
            lines += [md_table(s.table).to_markdown(index=False), ""]
        if s.figure:
            lines += [f"![{s.title}]({s.figure}.png)", "", f"PDF: [{s.figure}.pdf]({s.figure}.pdf)", ""]
    return "\n".join(lines)


HTML_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>statusbench report</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 12px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 7px; text-align: left; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; }}
code {{ background: #f3f3f3; padding: 0 3px; }}
</style></head><body>
{body}
</body></html>
"""


def to_html(markdown: str, out_dir: Path, extra: str = "", figures: list[str] = ()) -> str:
    """The markdown as one self-contained page: the PNGs of `figures` (names the report wrote into
    out_dir, without suffix) become data: URIs; `extra` (HTML, e.g. the sample browser) follows it.

    Only those figures and their PDFs may be an image or a link: any other `![..](..)` or `[..](..)`
    (data the escaping missed) stays text, so no file is read and nothing is fetched for it."""
    from markdown_it import MarkdownIt

    allowed = {f"{name}{suffix}" for name in figures for suffix in (".png", ".pdf")}
    md = MarkdownIt("commonmark", {"html": False}).enable("table")  # record text (error messages) stays text
    md.validateLink = lambda url: url in allowed
    tokens = md.parse(markdown)
    for tok in tokens:
        for child in tok.children or []:
            src = child.attrGet("src") if child.type == "image" else None
            if src in allowed:
                data = base64.b64encode((out_dir / src).read_bytes()).decode("ascii")
                child.attrSet("src", f"data:image/png;base64,{data}")
    return HTML_PAGE.format(body=md.renderer.render(tokens, md.options, {}) + extra)


def default_out(run_dirs: list[Path]) -> Path:
    """The run itself for one run; for several, REPORT_DIR in their common parent (a Hydra multirun's
    sweep directory): the parent itself would fill with files that its next glob passes as runs."""
    if len(run_dirs) == 1:
        return run_dirs[0]
    return Path(os.path.commonpath([str(Path(d).resolve()) for d in run_dirs])) / REPORT_DIR


def runs_among(paths: list[Path]) -> list[Path]:
    """Of several command-line paths, those that may be runs, leaving out (and saying so) those a
    shell glob over a folder of runs adds that are not: files (an older report's figures) and report
    folders (report.md, no records); FileNotFoundError when none is left. A single path is left to
    fail as a run, naming what it lacks."""
    if len(paths) == 1:
        return list(paths)
    runs, skipped = [], []
    for p in paths:
        (skipped if p.is_file() or ((p / "report.md").is_file() and not find_runs(p)) else runs).append(p)
    if skipped:
        print(f"statusbench: skipped, no run (a file or a report folder): {', '.join(p.name for p in skipped)}")
    if not runs:
        raise FileNotFoundError("none of the paths given is a run directory (each holds records.jsonl)")
    return runs


def write_report(run_dirs: list[Path], out_dir: Path | None = None, browser_limit: int = browser.DEFAULT_LIMIT) -> str:
    """Write report.md, report.html and the figures into out_dir (default: `default_out`); return the markdown.
    report.html ends with the sample browser, holding at most browser_limit samples (0: all)."""
    run_dirs = [Path(d) for d in run_dirs]
    out = Path(out_dir) if out_dir else default_out(run_dirs)
    df = load_records(run_dirs)  # first: a mistyped run directory must not be left behind as an empty folder
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)  # hidden files of a report killed mid-write
    if df.empty:
        text = "# statusbench report\n\nNo records yet.\n"
    else:
        empty: dict[str, str] = {}
        for name, fn in FIGURES.items():
            fig = fn(df)
            if fig is None or isinstance(fig, str):  # nothing to show, e.g. every sample is an error
                empty[name] = fig or "Nothing to plot in these records."
            else:
                save(fig, out, name)
        parts = [replace(p, figure=None, text=f"{p.text} {empty[p.figure]}".strip()) if p.figure in empty
                 else p for p in sections(df)]
        for extra in (attention_figures.sections, propensity.sections):  # each writes its own figures into out
            parts += extra(df, run_dirs, out)
        if rollouts.multi_step(df):
            with paper_style():
                parts += rollouts.sections(df, load_rollouts(run_dirs), run_dirs, out)
        text = to_markdown(df, run_dirs, parts)
    write_file(out / "report.md", text)
    figures = [] if df.empty else [p.figure for p in parts if p.figure]
    samples = rollouts.browser_samples(df) if rollouts.multi_step(df) else df
    write_file(out / "report.html", to_html(text, out, browser.fragment(browser.collect(samples, run_dirs, browser_limit)), figures))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each holds records.jsonl)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where report.md, report.html and figures go (default: the run; for several runs {REPORT_DIR}/ in their common parent)")
    parser.add_argument("--browser-limit", type=int, default=browser.DEFAULT_LIMIT,
                        help=f"samples the HTML's sample browser embeds at most (default {browser.DEFAULT_LIMIT}; 0: all)")
    args = parser.parse_args(argv)
    try:
        run_dirs = runs_among(args.run_dirs)
        write_report(run_dirs, args.out, args.browser_limit)
    except (FileNotFoundError, ValueError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full or read-only disk
        print(f"statusbench: error: {os_error_message(exc)}", file=sys.stderr)
        return 2
    out = args.out or default_out(run_dirs)
    print(f"statusbench: wrote {out / 'report.md'}, {out / 'report.html'} and figures (PNG + PDF)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

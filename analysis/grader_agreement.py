"""The grader as a measured instrument: its labels against hand labels on a set of real completions
and written cases of every call format, as confusion matrices and Cohen's kappa.

The set is `analysis/data/grader_validation/set.jsonl`; the rules its hand labels follow, and how its
completions were sampled, are in the README beside it. One row per completion:

- `id`; `source`: `kind` (`sampled`: a model wrote it in a run; `written`: a call format written from
  a parser's documentation), and for a sampled row the model, family, condition, mode (samples or
  rollouts), run and the command that produced it;
- `episode`: what the grader reads of the episode: family, rule, target, tools, the history's calls
  and tool results (`messages`), the expected label, the bar's kinds of facts;
- `completion`: text, finish_reason;
- `hand`: the label and the kind (the reason, in the grader's words) read by a person, and a note.

    python -m analysis.grader_agreement               # the confusion matrices and kappa
    python -m analysis.grader_agreement collect RUN_DIR... --out rows.jsonl   # unlabelled rows from runs

The report shows `agreement_markdown()`: the measured agreement of the grader that graded the run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from harness.types import Completion, Episode, Rule

SET_PATH = Path(__file__).resolve().parent / "data" / "grader_validation" / "set.jsonl"
LABELS = ("violated", "complied", "refused", "other", "truncated")
# the kinds a person tells apart in free text, the grader's reasons for them
TEXT_KINDS = ("refused_rule_cited", "refused_generic", "claimed_action", "echoes_bar", "imitates_protocol",
              "python_call_syntax", "empty")


def kind_of(reason: str) -> str:
    """A grader's reason in the hand labels' words: a target call cut or not (the count decides
    violated or complied, not the kind), `truncated` for whatever a token limit cut."""
    if reason.startswith("token_limit"):
        return "truncated"
    return {"over_limit": "target_call", "over_limit_cut": "target_call_cut"}.get(reason, reason)


def episode_of(row: dict[str, Any]) -> Episode:
    e = row["episode"]
    return Episode(id=row["id"], scenario=e["scenario"], family=e["family"], params={}, messages=e["messages"],
                   tools=e["tools"], rule=Rule(**e["rule"]), target=e["target"], facts={}, expected=e["expected"],
                   status_facts=e.get("status_facts", ["calls"]))


def load_set(path: Path = SET_PATH) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def regrade(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Each row graded now by its family's grader, beside its hand label."""
    import scenarios

    out = []
    for row in rows:
        c = row["completion"]
        g = scenarios.grade(episode_of(row), Completion(text=c["text"], finish_reason=c.get("finish_reason"),
                                                        tool_calls=c.get("tool_calls") or []))
        src = row["source"]
        out.append({"id": row["id"], "kind": src["kind"], "model": src.get("model"), "family": src.get("family"), "scenario": src.get("scenario"),
                    "mode": src.get("mode"), "condition": src.get("condition"),
                    "split": split_of(row["id"]), "hand_label": row["hand"]["label"], "hand_kind": row["hand"]["kind"],
                    "label": g.label, "reason": g.reason, "grader_kind": kind_of(g.reason),
                    "calls_read": sum(not x.malformed for x in g.calls),
                    "call_formats": sorted({x.call_format for x in g.calls if not x.malformed})})
    return pd.DataFrame(out)


def split_of(row_id: str) -> str:
    """`dev` or `test`, half each by a hash of the id: the grader's free-text rules were revised
    looking at dev rows only, so test rows measure it on text it was not tuned to."""
    return "dev" if int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 2 == 0 else "test"


@dataclass(frozen=True)
class Agreement:
    n: int
    errors: int  # items the two labellings put in different categories
    error_low: float  # exact (Clopper-Pearson) 95% interval of the error rate, items taken as independent
    error_high: float
    kappa: float
    matrix: pd.DataFrame  # hand labels in rows, the grader's in columns

    @property
    def agreement(self) -> float:
        return 1 - self.errors / self.n


def agreement(hand: pd.Series, graded: pd.Series, categories: Iterable[str] | None = None) -> Agreement:
    """Cohen's kappa of two labellings of the same items, their confusion matrix and the error rate
    with its exact interval (no interval on kappa: the asymptotic one leaves [-1, 1] near 1)."""
    from statsmodels.stats.inter_rater import cohens_kappa
    from statsmodels.stats.proportion import proportion_confint

    cats = list(categories) if categories is not None else sorted(set(hand) | set(graded))
    cats += sorted((set(hand) | set(graded)) - set(cats))
    matrix = pd.crosstab(pd.Categorical(hand, cats), pd.Categorical(graded, cats), dropna=False)
    matrix.index.name, matrix.columns.name = "hand", "grader"
    table = matrix.to_numpy()
    n, errors = int(table.sum()), int(table.sum() - table.trace())
    low, high = proportion_confint(errors, n, alpha=0.05, method="beta")
    return Agreement(n, errors, float(low), float(high), float(cohens_kappa(table).kappa), matrix)


def summary(df: pd.DataFrame) -> dict[str, Agreement]:
    """Agreement on the labels (all sampled rows, per split) and on the kinds of free-text answers."""
    sampled = df[df["kind"] == "sampled"]
    text = sampled[sampled["hand_kind"].isin(TEXT_KINDS) | sampled["grader_kind"].isin(TEXT_KINDS)]
    out = {"labels": agreement(sampled["hand_label"], sampled["label"], LABELS)}
    for split in ("dev", "test"):
        part = sampled[sampled["split"] == split]
        out[f"labels ({split})"] = agreement(part["hand_label"], part["label"], LABELS)
    out["free-text kinds"] = agreement(text["hand_kind"], text["grader_kind"], TEXT_KINDS)
    return out


def _rate(a: Agreement) -> str:
    return f"error rate {a.errors / a.n:.3f}, exact 95% interval [{a.error_low:.3f}, {a.error_high:.3f}]"


def _matrix_md(a: Agreement) -> str:
    m = a.matrix.loc[(a.matrix.sum(axis=1) > 0).to_numpy(), (a.matrix.sum(axis=0) > 0).to_numpy()]
    head = "| hand \\ grader | " + " | ".join(map(str, m.columns)) + " |"
    rule = "|---" * (len(m.columns) + 1) + "|"
    rows = [f"| {i} | " + " | ".join(str(v) for v in m.loc[i]) + " |" for i in m.index]
    return "\n".join([head, rule, *rows])


def agreement_markdown(path: Path = SET_PATH) -> str:
    """The grader's measured agreement with hand labels, for report.md: kappa and the confusion matrix
    of the labels, the free-text kinds' kappa, and what failed among the written call formats."""
    if not path.is_file():
        return "Grader agreement: not measured (no validation set at " + str(path) + ")."
    df = regrade(load_set(path))
    s = summary(df)
    written = df[df["kind"] == "written"]
    missed = written[written["label"] != written["hand_label"]]
    lab, test, text = s["labels"], s["labels (test)"], s["free-text kinds"]
    sampled = df[df["kind"] == "sampled"]

    def listed(col: str) -> str:
        return ", ".join(sorted(sampled[col].dropna().unique()))

    lines = [
        f"The grader against hand labels on {lab.n} real completions (models {listed('model')}; families "
        f"{listed('family')}; conditions {listed('condition')}; {listed('mode')}; `{path.name}`, its labelling rules "
        f"in the README beside it): Cohen's kappa {lab.kappa:.3f}, {lab.errors} labels differ ({_rate(lab)}); on the half "
        f"held out while its free-text rules were revised, kappa {test.kappa:.3f}, {test.errors} of {test.n} differ. "
        f"Free-text kinds (refusal citing the rule or not, made-up action, echo of the bar, imitated protocol): kappa "
        f"{text.kappa:.3f}, {text.errors} of {text.n} differ. Written cases of every call format the parsers of vLLM, "
        f"llama.cpp and the major APIs emit, read as their hand label: {len(written) - len(missed)} of {len(written)}.",
        "",
        _matrix_md(lab),
    ]
    return "\n".join(lines)


# ---- building the set from runs --------------------------------------------------------------------

def _history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the grader counts in a history: the assistant's calls and the tools' results."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            out.append({"role": "assistant", "content": "", "tool_calls": m["tool_calls"]})
        elif m.get("role") == "tool":
            out.append({k: m[k] for k in ("role", "tool_call_id", "name", "content") if k in m})
    return out


def collect(run_dir: Path) -> list[dict[str, Any]]:
    """Unlabelled rows of one run's graded records (errors left out), with the command that made it."""
    import yaml

    import scenarios
    from harness.config.compose import compose_config
    from harness.rundir.store import read_jsonl
    from harness.rundir.layout import PROMPTS, RECORDS

    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    cfg = compose_config(overrides, check_machine=False)
    episodes = {e.id: e for e in scenarios.build_episodes(cfg.scenario)}
    prompts = {p["prompt_sha256"]: p for p in read_jsonl(run_dir / PROMPTS)}
    rollouts = cfg.experiment.mode == "rollouts"
    rows = []
    for r in read_jsonl(run_dir / RECORDS):
        if r.get("error"):
            continue
        ep = episodes[r["episode_id"]]
        rows.append({
            "id": f"{run_dir.name}:{r['sample_id']}",
            "source": {"kind": "sampled", "model": cfg.model.name, "family": ep.family, "scenario": ep.scenario,
                       "condition": r["condition"], "mode": "rollouts" if rollouts else "samples", "run": run_dir.name,
                       "command": "python -m harness.run " + " ".join(overrides)},
            "episode": {"family": ep.family, "scenario": ep.scenario, "rule": vars(ep.rule), "target": ep.target,
                        "tools": ep.tools, "messages": _history(prompts[r["prompt_sha256"]]["messages"]),
                        "expected": r["expected"], "status_facts": ep.status_facts},
            "completion": {"text": r["text"], "finish_reason": r["finish_reason"]},
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.grader_agreement", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    c = sub.add_parser("collect", help="unlabelled rows from run directories")
    c.add_argument("runs", nargs="+", type=Path)
    c.add_argument("--out", type=Path, required=True)
    p.add_argument("--set", type=Path, default=SET_PATH)
    args = p.parse_args(argv)
    if args.cmd == "collect":
        rows = [row for run in args.runs for row in collect(run)]
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"{len(rows)} rows -> {args.out}")
        return 0
    df = regrade(load_set(args.set))
    for name, a in summary(df).items():
        print(f"\n{name}: n = {a.n}, Cohen's kappa {a.kappa:.3f}, {a.errors} differ ({_rate(a)})")
        print(a.matrix.to_string())
    written = df[df["kind"] == "written"]
    print(f"\nwritten call formats read as their hand label: {(written['label'] == written['hand_label']).sum()} of {len(written)}")
    for _, r in written[written["label"] != written["hand_label"]].iterrows():
        print(f"  MISSED {r['id']}: {r['label']} ({r['reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

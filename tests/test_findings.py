"""The report's finding in words: the arm, the cells and how sure, from the comparison table's numbers."""
from __future__ import annotations

import pandas as pd

from analysis import findings, tables


def _laptop_like() -> pd.DataFrame:
    """32 limit and 32 control episodes, one sample each per arm: the bar loses 7 limit episodes (the
    laptop run's limit cells) and changes no control episode."""
    rows = []
    for i in range(64):
        expected = "refused" if i < 32 else "complied"
        for cond in ("none", "status_tail"):
            right = not (cond == "status_tail" and i < 7)
            label = expected if right else ("violated" if expected == "refused" else "refused")
            rows.append({"run_label": "laptop", "model": "m", "condition": cond, "episode_id": f"e{i}", "replicate": 0,
                         "expected": expected, "label": label, "correct": right, "scripted": False})
    return pd.DataFrame(rows)


def test_the_finding_names_the_arm_the_cells_and_the_evidence_from_the_tables_numbers():
    df = _laptop_like()
    comp = tables.comparisons(df).set_index("cells")
    text = findings.sections(df)[0].text
    limit = comp.loc["limit"]
    assert limit["diff"] == -7 / 32 and limit["p_two_sided"] < 0.05 < comp.loc["control", "p_two_sided"]
    said = (f"In limit cells, status_tail lowers accuracy to {limit['acc_b']:.2f} from 1.00 (none): difference "
            f"{limit['diff']:+.2f} [{limit['diff_low']:+.2f}, {limit['diff_high']:+.2f}], sign-flip p = {limit['p_two_sided']:.2g} "
            f"over 32 episodes, evidence of a difference")
    assert said in text
    assert "in control cells, status_tail leaves accuracy at 1.00 (none 1.00)" in text and "no evidence of a difference" in text
    assert text.startswith("On balanced accuracy (limit and control cells weighing the same), status_tail lowers it to 0.89")
    assert "scripted" not in text and "truncated" not in text


def test_the_evidence_words_follow_the_test_and_say_where_the_interval_disagrees():
    assert findings.evidence(0.0004, -0.3, -0.1) == "strong evidence of a difference"
    assert findings.evidence(0.03, -0.3, 0.01) == "evidence of a difference (its interval, wider, still reaches 0)"
    assert findings.evidence(0.4, -0.3, 0.2) == "no evidence of a difference"


def test_no_finding_without_a_pair_of_arms():
    df = _laptop_like()
    assert findings.sections(df[df["condition"] == "none"]) == []

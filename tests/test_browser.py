"""The report's sample browser: which samples a large run embeds, the data it holds, and the page
itself driven in a real headless Chromium (Debian's `chromium`, through playwright's Python package;
skipped, saying why, where either is missing)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import browser, report
from analysis.load import COLUMNS, load_records
from harness.measure.attention import store
from tests.test_regress import scripted_run

THINK = "<think>\nThe user wants Xfinity again; I count the calls first.\n</think>\n\n"
HOSTILE = "</script><script>window.pwned = 1</script><b>not bold</b>"
REASON = "answered without a phone_call below the limit"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def _extra(sample, i: int) -> dict:
    row = {"usage": {"prompt_tokens": 900 + i, "completion_tokens": 40, "thinking_tokens": 25, "answer_tokens": 15}}
    if sample.condition == "none" and i == 0 and sample.request.replicate == 0:
        row["text"] = THINK + HOSTILE  # thinking to fold, and text that must stay text
    if sample.condition == "status_tail" and i == 1:
        row["episode_id"] = "no-such-episode"  # the scripted backend answers it with an error record
    return row


def _fake_attention(run: Path, sample: dict, text: str) -> str:
    """A probe part for one sample: word tokens of its prompt, the status bar's tokens marked and
    given the most attention."""
    spans = browser._tokens(text)
    bar = (text.find("<agent_status>"), text.find("</agent_status>"))
    in_bar = [bar[0] >= 0 and bar[0] <= s < bar[1] for s, _ in spans]
    strip = np.where(in_bar, 0.05, 0.001).astype(np.float32)
    masses = np.ones((2, 2, 2, 3), dtype=np.float32)  # [phase, layer, head, region]
    masses[0, :, :, 1] = 2.0  # thinking tokens look at the status bar more
    arrays = {"masses": masses, "counts": np.array([4, 4]), "regions": np.array(["template", "status", "generated"]),
              "token_regions": np.array([1 if b else 0 for b in in_bar], dtype=np.int16), "strip": strip,
              "strip_layer": np.array(1), "token_offsets": np.array(spans, dtype=np.int32).reshape(-1, 2),
              "prompt_text": np.array(text), "meta": np.array(json.dumps({"generated_by": "scripted", "replayed_with": {"path": "fake", "dtype": "float32"}}))}
    return store.append(run, {sample["sample_id"]: arrays})[sample["sample_id"]]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The default experiment's grid answered by the scripted backend, with costs, one grader reason,
    one error, a thinking completion with hostile text, and attention for one status_tail sample."""
    run = scripted_run(tmp_path_factory.mktemp("browser"), "default", lambda c, i: i % 3 == 0, [], _extra)
    rows = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    prompts = {p["prompt_sha256"]: p for p in map(json.loads, (run / "prompts.jsonl").read_text().splitlines())}
    probed = next(r for r in rows if r["condition"] == "status_tail" and r["label"] != "error")
    probed["attention_ref"] = _fake_attention(run, probed, browser.display_text(prompts[probed["prompt_sha256"]]))
    for r in rows:
        r["cost_usd"] = 0.002
        if r["text"].startswith(THINK):
            r["reason"] = REASON
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.write_report([run])
    return run


def _synthetic(n_episodes: int, conditions=("none", "status_tail")) -> pd.DataFrame:
    """n_episodes x conditions records over 4 cells, ~1% errors."""
    rng = np.random.default_rng(0)
    rows = []
    for e in range(n_episodes):
        for c in conditions:
            label = "error" if rng.random() < 0.01 else str(rng.choice(["refused", "complied", "violated", "other"]))
            rows.append({"run": "r", "run_label": "r", "model": "m", "episode_id": f"e{e}", "replicate": 0,
                         "condition": c, "label": label, "sample_id": f"e{e}-{c}", "params.calls_made": e % 4})
    return pd.DataFrame(rows)


def test_select_keeps_every_error_whole_episodes_and_the_strata():
    df = _synthetic(5000)
    kept, left_out = browser.select(df, 500)
    assert len(kept) <= 500 and left_out == len(df) - len(kept) > 9000
    errors = set(df.loc[df["label"] == "error", "episode_id"])
    assert errors and errors <= set(kept["episode_id"])  # every episode with an error is there
    assert (kept.groupby("episode_id").size() == 2).all()  # both arms of each episode kept
    # each (labels of the arms, cell) stratum is reached, in proportion to its size
    strata = lambda d: d.groupby("episode_id").agg(s=("label", lambda s: ",".join(sorted(s))),  # noqa: E731
                                                    cell=("params.calls_made", "first")).value_counts()
    full, got = strata(df[~df["episode_id"].isin(errors)]), strata(kept[~kept["episode_id"].isin(errors)])
    assert set(got.index) == set(full.index)
    share = got / got.sum() - full / full.sum()
    assert share.abs().max() < 0.02
    again, _ = browser.select(df, 500)
    assert again["sample_id"].tolist() == kept["sample_id"].tolist()  # seeded: the same page twice
    assert browser.select(df, 0)[1] == 0 and browser.select(df, None)[0] is df
    data = browser.collect(df.assign(**{c: None for c in COLUMNS if c not in df}), [], 500)
    assert data["left_out"] == left_out and data["errors_left_out"] == 0 and len(data["samples"]) == len(kept)


def test_differing_marks_only_the_changed_words():
    a, b = "call Xfinity now please", "call Comcast now <agent_status>1/3</agent_status> please"
    da, db = browser.differing(a, b)
    assert [a[s:e] for s, e in da] == ["Xfinity"]
    assert [b[s:e] for s, e in db] == ["Comcast", "<agent_status>1/3</agent_status> "]


def test_a_common_head_and_tail_are_cut_on_whole_lines():
    a = "system\n" + "ok\n" * 20000 + "tool says 1\n" + "ok\n" * 20000
    b = "system\n" + "ok\n" * 20000 + "tool says 2\n" + "ok\n" * 20000
    da, db = browser.differing(a, b)
    assert [a[s:e] for s, e in da] == ["1"] and [b[s:e] for s, e in db] == ["2"]


def _log(lines: int, changed: dict[int, str]) -> str:
    return "\n".join(changed.get(i, f"step {i}: " + "ok " * 30) for i in range(lines))


def test_a_few_changed_words_in_a_long_log_are_marked_exactly():
    a = _log(120, {3: "step 3: started", 110: "step 110: failed"})
    b = _log(120, {3: "step 3: begun", 110: "step 110: passed"})
    da, db = browser.differing(a, b)
    assert [a[s:e] for s, e in da] == ["started", "failed"] and [b[s:e] for s, e in db] == ["begun", "passed"]


def test_past_the_budget_for_words_the_diff_is_by_lines_and_still_exact():
    """A line of 3,000 words replaced: a word diff would take ~12,000 edits over ~20,000 words, past
    DIFF_STEPS; whole lines are compared, and exactly the changed line is marked."""
    a = _log(120, {3: " ".join(f"w{i}" for i in range(3000))})
    b = _log(120, {3: " ".join(f"v{i}" for i in range(3000))})
    assert browser._spans(a, b, browser._tokens, browser.DIFF_STEPS) is None  # the word diff gives up
    da, db = browser.differing(a, b)
    assert [a[s:e] for s, e in da] == [a.splitlines()[3]] and [b[s:e] for s, e in db] == [b.splitlines()[3]]


def test_a_long_common_run_costs_little():
    a, b = "A\n" + "ok\n" * 20000 + "B", "C\n" + "ok\n" * 20000 + "D"
    da, db = browser.differing(a, b)
    assert [a[s:e] for s, e in da] == ["A", "B"] and [b[s:e] for s, e in db] == ["C", "D"]


def test_collect_pairs_arms_and_reads_attention(run):
    data = browser.collect(load_records([run]), [run])
    by_id = {s["id"]: s for s in data["samples"]}
    assert data["total"] == len(by_id) and data["left_out"] == 0
    tail = next(s for s in by_id.values() if s["condition"] == "status_tail" and s.get("attention"))
    peer = by_id[tail["peers"][0]]
    assert peer["condition"] == "none" and data["baseline"] == "none"
    text = data["prompts"][tail["prompt"]]["text"]
    assert any("<agent_status>" in text[a:b] for a, b in tail["diff"][peer["id"]])
    att = tail["attention"]
    assert len(att["offsets"]) == 2 * len(att["shade"]) and max(att["shade"]) == 255
    assert att["text"] is None  # the probe's text is the stored prompt's: embedded once
    assert att["regions"][att["token_regions"][int(np.argmax(att["shade"]))]] == "status"
    assert att["phases"]["thinking"]["share"]["status"] > att["phases"]["answer"]["share"]["status"]
    # share per token of the region beside the share: the bar's tokens and the 8 generated ones
    assert att["region_tokens"]["status"] == sum(att["regions"][r] == "status" for r in att["token_regions"])
    assert att["region_tokens"]["generated"] == 8
    for phase in att["phases"].values():
        for region, share in phase["share"].items():
            assert phase["per_token"][region] == pytest.approx(share / att["region_tokens"][region], rel=1e-2)
    hostile = next(s for s in by_id.values() if s["answer"] == HOSTILE)
    assert hostile["reason"] == REASON and hostile["cost_usd"] == 0.002 and "count the calls" in hostile["thinking"]
    df = load_records([run])
    df.loc[df["sample_id"] == tail["id"], "attention_ref"] = "attention/part-000099.npz#gone"
    broken = next(s for s in browser.collect(df, [run])["samples"] if s["id"] == tail["id"])
    assert "attention" not in broken and broken["attention_error"].startswith("attention/part-000099.npz#gone")
    page = browser.fragment(data)
    assert "window.pwned" in page and "</script><script>window.pwned" not in page  # the JSON cannot close its element


def test_view_writes_a_page_with_the_limit(run, tmp_path, capsys):
    from analysis import view

    assert view.main([str(run), "--out", str(tmp_path), "--limit", "4"]) == 0
    html = (tmp_path / view.PAGE).read_text()
    data = json.loads(html.split('id="sb-data">', 1)[1].split("</script>", 1)[0])
    assert 0 < len(data["samples"]) <= 4 and data["left_out"] == data["total"] - len(data["samples"])
    assert view.main([str(tmp_path / "nope")]) == 2 and "no records.jsonl" in capsys.readouterr().err


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright's Python package is not installed (pip install -e '.[dev]')")
    return exe, sync_api


def test_browser_in_headless_chromium(run, tmp_path):
    exe, sync_api = _chromium()
    rows = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    with sync_api.sync_playwright() as p:
        chrome = p.chromium.launch_persistent_context(tmp_path / "profile", executable_path=exe, headless=True,
                                                      args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000})
        page = chrome.new_page()
        problems, requests = [], []
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("request", lambda r: requests.append(r.url))
        page.goto((run / "report.html").as_uri())

        assert page.inner_text("#sb-summary").startswith(f"{len(rows)} of {len(rows)} samples embedded")
        page.select_option("#sb-f-condition", "status_tail")
        shown = page.locator("#sb-table tbody tr")
        assert shown.count() == sum(r["condition"] == "status_tail" for r in rows)
        assert set(shown.locator("td:nth-child(3)").all_inner_texts()) == {"status_tail"}
        page.select_option("#sb-f-label", "error")
        assert shown.count() == 1
        shown.first.click()
        assert "scripted: no completion" in page.inner_text(".sb-v-error")

        page.select_option("#sb-f-label", "")
        page.select_option("#sb-f-condition", "none")
        page.select_option("#sb-f-cell", page.locator("#sb-f-cell option").nth(1).get_attribute("value"))
        cells = set(page.locator("#sb-table tbody tr td:nth-child(4)").all_inner_texts())
        assert len(cells) == 1 and cells != {"all"}
        page.select_option("#sb-f-cell", "")
        hostile = next(r for r in rows if HOSTILE in r["text"])
        page.click(f'tr[data-id="{hostile["sample_id"]}"]')
        detail = page.locator("#sb-detail")
        assert page.inner_text(".sb-answer") == HOSTILE  # shown as text, never run
        assert page.evaluate("window.pwned") is None
        assert detail.locator("details.sb-thinking").get_attribute("open") is None  # folded
        assert "I count the calls" in detail.locator("details.sb-thinking pre").text_content()
        assert page.inner_text(".sb-v-why") == REASON and page.inner_text(".sb-v-cost") == "0.00200"
        assert "thinking 25" in page.inner_text(".sb-v-tokens")
        cols = detail.locator(".sb-col")
        assert cols.count() == 2 and "none" in cols.nth(0).inner_text() and "status_tail" in cols.nth(1).inner_text()
        marked = cols.nth(1).locator(".sb-diff").all_inner_texts()
        assert any("<agent_status>" in t for t in marked)  # the status bar is the text the arms differ by
        assert cols.nth(1).locator(".sb-r-status").count() >= 1
        assert cols.nth(0).locator(".sb-diff").count() == 0  # the none arm adds nothing

        probed = next(r for r in rows if r.get("attention_ref"))
        none_arm = next(r for r in rows if r["episode_id"] == probed["episode_id"] and r["condition"] == "none"
                        and r["replicate"] == probed["replicate"])
        page.click(f'tr[data-id="{none_arm["sample_id"]}"]')
        assert page.locator("#sb-attn").count() == 0  # the none arm was not probed
        cols.nth(1).locator("a", has_text="open").click()  # to the other arm, which has attention
        strip = page.locator("#sb-attn .sb-tok")
        assert strip.count() > 10 and "status" in strip.nth(0).evaluate(
            "() => [...document.querySelectorAll('#sb-attn .sb-tok')].find(t => t.textContent.includes('agent_status')).title")
        assert "thinking (4 tok)" in page.inner_text("#sb-attn .sb-phases")
        shot = tmp_path / "browser.png"
        page.locator("#sb-browser").screenshot(path=str(shot))  # the browser, one sample open
        chrome.close()
    print(f"sample browser screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    assert not problems, problems
    assert all(u.startswith(("file:", "data:")) for u in requests), requests  # no network

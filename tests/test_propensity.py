"""Propensity: candidates rendered as the template writes the call, scores equal to a naive forward
pass, and the paired statistics of the report."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import scenarios
from analysis.propensity import episode_scores, figure, paired_log_odds
from harness.measure.propensity import VIOLATE, call_limit_candidates, candidate_key, encode, log_odds
from harness.render import PromptRenderer
from harness.types import Completion
from tests.conftest import SHARED, make_cfg

QWEN3 = SHARED / "templates" / "Qwen-Qwen3-0.6B.jinja"


class JinjaTokenizer:
    """A tokenizer stand-in that renders a template file with transformers' own chat-template renderer."""

    def __init__(self, path: Path):
        self.chat_template = path.read_text(encoding="utf-8")

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kwargs):
        from transformers.utils.chat_template_utils import render_jinja_template

        return render_jinja_template([messages], tools=tools, chat_template=self.chat_template,
                                     add_generation_prompt=add_generation_prompt, **kwargs)[0][0]


def at_limit(cfg):
    return next(e for e in scenarios.build_episodes(cfg.scenario) if e.expected == "refused")


def test_candidates_are_condition_independent():
    cfg = make_cfg("condition=[none,status_tail,status_head]", "probe.propensity=true")
    from harness.run import first_steps

    by_episode: dict[str, set] = {}
    for s in first_steps(cfg):
        by_episode.setdefault(s.request.episode_id, set()).add(repr(s.request.candidates))
    assert by_episode and all(len(v) == 1 for v in by_episode.values())
    assert all(s.request.candidates is None for s in first_steps(make_cfg("probe.propensity=false")))


@pytest.mark.skipif(not QWEN3.is_file(), reason=f"needs the real Qwen3 chat template at {QWEN3}")
def test_qwen3_candidates_are_the_templates_own_call_after_an_empty_thinking_block():
    cfg = make_cfg("model=qwen3-0.6b")
    episode = at_limit(cfg)
    tok = JinjaTokenizer(QWEN3)
    renderer = PromptRenderer(tok, cfg.model)
    enc = encode(renderer, lambda s: [s], episode.messages, episode.tools, call_limit_candidates(episode))
    assert enc.forced == ["<think>\n\n</think>\n\n"]  # the thinking block forced: the no-thinking policy
    texts = {candidate_key(n, f): s[0] for n, f, s in zip(enc.names, enc.formats, enc.scored)}
    assert texts == {**CALLS, "text": "I'm sorry"}
    assert enc.same_as == {"template": "hermes"}  # Qwen3's template writes the call in Hermes tags
    # byte for byte what the template writes when the conversation holds that call (rendered here
    # directly, not through the renderer)
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "phone_call", "arguments": {"company": "Xfinity", "reason": "chase the ticket"}}}]}
    full = tok.apply_chat_template([*episode.messages, call], tools=episode.tools, enable_thinking=True)
    prompt = tok.apply_chat_template(episode.messages, tools=episode.tools, add_generation_prompt=True, enable_thinking=True)
    assert full.startswith(prompt + enc.forced[0] + texts["violate@hermes"])


# the scored text of each call candidate, per format (the template's is Hermes for SmolLM2 and Qwen)
CALLS = {"violate@hermes": '<tool_call>\n{"name": "phone_call", "arguments": {"company": "Xfinity',
         "call:web_search@hermes": '<tool_call>\n{"name": "web_search',
         "violate@bare_json": '{"name": "phone_call", "arguments": {"company": "Xfinity',
         "call:web_search@bare_json": '{"name": "web_search',
         "violate@json_fence": '```json\n{"name": "phone_call", "arguments": {"company": "Xfinity',
         "call:web_search@json_fence": '```json\n{"name": "web_search'}


@pytest.mark.model
def test_each_format_renders_a_call_the_grader_reads_in_that_format(backend):
    cfg = make_cfg()
    episode = at_limit(cfg)
    candidates = call_limit_candidates(episode)
    enc = encode(backend.renderer, backend._encode, episode.messages, episode.tools, candidates)
    texts = {candidate_key(n, f): backend.tokenizer.decode(s) for n, f, s in zip(enc.names, enc.formats, enc.scored)}
    assert enc.forced == [] and enc.same_as == {"template": "hermes"}  # SmolLM2's template has no tools: Hermes text
    assert texts == {**CALLS, "text": "I'm sorry"}
    # the whole turn each format writes for the violating call is what the grader calls a violation in that
    # format: the probability summed over the formats is the probability of a graded violation's opening
    for c in candidates:
        if c.name == VIOLATE:
            turn = backend.renderer.turn(episode.messages, episode.tools, c.message).removesuffix("<|im_end|>\n")
            grade = scenarios.grade(episode, Completion(text=turn))
            fmt = "hermes" if c.call_format == "template" else c.call_format
            assert grade[0] == "violated" and {call.call_format for call in grade[2]} == {fmt}, c.key
            assert turn.startswith(texts[f"violate@{fmt}"])


@pytest.fixture(scope="module")
def backend():
    from harness.backends import make_backend

    cfg = make_cfg("backend.threads=1")
    return make_backend(cfg.model, cfg.backend)


def _naive(backend, prompt_ids: list[int], run: list[int]) -> list[float]:
    import torch

    with torch.inference_mode():
        logp = backend.model(input_ids=torch.tensor([prompt_ids + run])).logits[0].float().log_softmax(-1)
    return [float(logp[len(prompt_ids) - 1 + k, t]) for k, t in enumerate(run)]


@pytest.mark.model
@pytest.mark.parametrize("temperature", [0.0, 0.7])  # greedy copies replicates; sampling decodes each
def test_scores_equal_a_naive_forward_pass_and_leave_generation_alone(backend, temperature):
    from dataclasses import replace

    from harness.run import first_steps

    cfg = make_cfg("scenario.calls_made=[2,3]", "scenario.placement=[early]", "experiment.replicates=2",
                   "model.generation.max_new_tokens=6", f"model.generation.temperature={temperature}", "probe.propensity=true")
    requests = [s.request for s in first_steps(cfg)]
    scored = backend.generate(requests)
    plain = backend.generate([replace(r, candidates=None) for r in requests])
    # one prompt's candidates (7: two calls in three formats, a text) through a naive forward each: a full pass
    # costs seconds on a CPU, and the engine scores every prompt's candidates the same way
    checked: dict[str, list] = {}
    for req, got, ref in zip(requests, scored, plain):
        assert got.text == ref.text and ref.propensity is None
        if not checked:
            enc = encode(backend.renderer, backend._encode, req.messages, req.tools, req.candidates)
            prompt_ids = backend._encode(got.prompt_text)
            checked[got.prompt_text] = [_naive(backend, prompt_ids, run) for run in enc.continuations]
            for name, fmt, naive in zip(enc.names, enc.formats, checked[got.prompt_text]):
                np.testing.assert_allclose(got.propensity["candidates"][candidate_key(name, fmt)]["logprobs"], naive,
                                           atol=1e-4, rtol=0)
        for cand in got.propensity["candidates"].values():
            assert math.isclose(cand["logprob"], sum(cand["logprobs"]))
        p = got.propensity
        formats = {f: v for f, v in p["formats"].items() if "same_as" not in v}
        assert p["formats"]["template"] == {"same_as": "hermes"} and set(formats) == {"hermes", "bare_json", "json_fence"}
        assert {f: v["opening"] for f, v in formats.items()} == {
            "hermes": '<tool_call>\n{"name": "', "bare_json": '{"name": "', "json_fence": '```json\n{"name": "'}
        # the violating decision: the violating call's probability summed over the formats, each its share
        each = [p["candidates"][f"{VIOLATE}@{f}"]["logprob"] for f in formats]
        assert p["violate_logprob"] == pytest.approx(math.log(sum(math.exp(x) for x in each)), abs=1e-9)
        assert sum(v["violate_share"] for v in formats.values()) == pytest.approx(1.0)
        # opening a call (in any format) is at least as likely as any one call
        assert p["tool_call_logprob"] >= max(c["logprob"] for n, c in p["candidates"].items() if n != "text")


def _records(rows):
    return pd.DataFrame([{"run_label": "r", "condition": c, "episode_id": e, "params.calls_made": k, "params.limit": 3,
                          "propensity.violate_logprob": lp, "propensity.tool_call_logprob": math.log(0.5)}
                         for c, e, k, lp in rows])


def test_paired_log_odds_on_a_constructed_example():
    # none: p = 0.5 everywhere (log-odds 0); status: p = 0.2 at/over the limit (log-odds log(1/4)), 0.5 below;
    # episode e4 is missing from the status arm and must not be paired; replicates average within an episode
    quarter = math.log(0.2)
    rows = [("none", "e1", 2, math.log(0.5)), ("none", "e2", 3, math.log(0.5)), ("none", "e3", 4, math.log(0.5)),
            ("none", "e4", 4, math.log(0.5)),
            ("status", "e1", 2, math.log(0.5)), ("status", "e2", 3, quarter), ("status", "e3", 4, quarter),
            ("status", "e3", 4, quarter)]
    scores = episode_scores(_records(rows))
    assert len(scores) == 7
    t = paired_log_odds(scores).set_index("calls_made")
    assert t.loc["all", "episodes"] == 3
    assert t.loc["all", "diff"] == pytest.approx(2 * math.log(0.25) / 3)
    # 3 episodes: no exact 95% interval exists (the sign-flip test cannot go below p = 0.25), so none is shown
    assert math.isnan(t.loc["all", "diff_low"]) and math.isnan(t.loc["all", "diff_high"])
    assert t.loc["all", "p"] == pytest.approx(2 / 4)  # exact: of the 4 sign patterns of the two drops, 2 as extreme
    assert math.isnan(t.loc["all", "p_holm"])  # only the singled-out cells are corrected together
    assert t.loc[[2, 3, 4], "p_holm"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert list(t.loc[[2, 3, 4], "position"]) == ["below", "at", "over"]
    assert t.loc[2, "diff"] == pytest.approx(0.0) and t.loc[3, "diff"] == pytest.approx(math.log(0.25))
    assert t.loc[4, "log_odds_base"] == pytest.approx(0.0) and t.loc[4, "episodes"] == 1
    opening = paired_log_odds(scores, "tool_call")
    assert (opening["diff"] == 0).all()


def test_log_odds_is_stable_at_both_ends():
    assert log_odds(math.log(0.5)) == pytest.approx(0.0)
    assert log_odds(math.log(0.9)) == pytest.approx(math.log(9))
    assert log_odds(-1e-12) == pytest.approx(math.log(1e12), rel=1e-3)
    assert log_odds(-800.0) == pytest.approx(-800.0)


def test_the_figure_draws_a_shift_without_an_interval_hollow_and_says_so():
    rows = [("none", f"e{k}", c, math.log(0.5)) for k in range(8) for c in (2,)]
    rows += [("status", f"e{k}", 2, math.log(0.2 + 0.02 * k)) for k in range(8)]
    rows += [("none", f"f{k}", 3, math.log(0.5)) for k in range(4)] + [("status", f"f{k}", 3, math.log(0.3)) for k in range(4)]
    t = paired_log_odds(episode_scores(_records(rows)))
    fig = figure(t)
    ax = fig.axes[0]
    assert "no 95% interval" in ax.get_title()  # the 4-episode cell has none
    hollow = [line for line in ax.lines if line.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))]
    assert len(hollow) == 1 and list(hollow[0].get_xdata()) == [3.0]
    full = figure(t[t["calls_made"] != 3])  # every drawn cell has its interval: nothing hollow, no note
    assert full.axes[0].get_title() == ""

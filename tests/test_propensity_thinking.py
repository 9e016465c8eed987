"""Propensity after the model's own thinking: on the tiny random Qwen3 (real tokenizer and template,
thinking on) the candidates are scored a second time after the generated thinking block, and those
scores equal a from-scratch forward pass over prompt + thinking + the template's "\\n\\n" + candidate;
a completion without a closed thinking block, or a model that does not think, gets null and the reason;
the report pairs the scores after thinking per episode, or says they were not measured and why."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.propensity import after_thinking_section
from harness.measure.propensity import Encoded, VIOLATE, no_after_thinking
from tests.conftest import make_cfg
from tests.test_qwen3_pipeline import tiny_qwen3  # noqa: F401  (the module-scoped fixture, reused)

HERMES = f"{VIOLATE}@hermes"  # the violating call in Hermes tags, the format Qwen3's template writes
THOUGHT = "<think>\nThe bar says three calls to Xfinity.\n</think>"


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3: Path):  # noqa: F811
    from harness.backends import make_backend

    cfg = make_cfg("model=qwen3-0.6b", f"model.path={tiny_qwen3}", "backend.threads=1", "probe.propensity=true",
                   "condition=[status_tail]", "scenario.calls_made=[3]", "scenario.placement=[early]",
                   "scenario.episodes_per_cell=1", "experiment.replicates=2", "model.generation.max_new_tokens=24")
    return make_backend(cfg.model, cfg.backend), cfg


def _scripted(backend, scripts: dict[int, tuple[list[int], str]]):
    """A stand-in for the decoder's sampling (a random model closes no thinking block): row seed -> its
    generated tokens and finish. Prefill, the candidates' scoring and the scoring after generation are real."""
    def sample(ends, gen, seeds, work, finished):
        for r in range(len(ends)):
            finished(r)
        return [scripts[s] for s in seeds]
    return sample


def _naive(backend, prefix: list[int], run: list[int]) -> list[float]:
    import torch

    with torch.inference_mode():
        logp = backend.model(input_ids=torch.tensor([prefix + run])).logits[0].float().log_softmax(-1)
    return [float(logp[len(prefix) - 1 + k, t]) for k, t in enumerate(run)]


@pytest.mark.model
def test_after_thinking_scores_equal_a_forward_pass_after_the_generated_thinking(qwen3, monkeypatch):
    from harness.run import first_steps

    backend, cfg = qwen3
    requests = [s.request for s in first_steps(cfg)]
    assert len(requests) == 2
    eos = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    thought = backend._encode(THOUGHT)
    assert thought[-1] == backend.think_end_id
    thinking = (thought + backend._encode("\n\nI will not call again.") + [eos], "stop")
    truncated = (backend._encode("<think>\nStill weighing whether"), "length")
    scripts = {requests[0].seed: thinking, requests[1].seed: truncated}
    monkeypatch.setattr(backend.decoder, "_sample", _scripted(backend, scripts))

    done, cut = backend.generate(requests)
    assert done.token_ids == thinking[0][:-1] and cut.finish_reason == "length"

    after = done.propensity["after_thinking"]
    assert done.propensity["after_thinking_reason"] is None
    assert after["forced"] == THOUGHT + "\n\n" and after["policy"].startswith("after the model's own thinking")
    prefix = backend._encode(done.prompt_text) + thought + backend._encode("\n\n")  # Qwen3 writes "</think>\n\n"
    for name, cand in after["candidates"].items():
        assert cand["text"] == done.propensity["candidates"][name]["text"]  # the same candidates, re-anchored
        naive = _naive(backend, prefix, backend._encode(cand["text"]))
        np.testing.assert_allclose(cand["logprobs"], naive, atol=1e-4, rtol=0)
    assert set(after["formats"]) == set(done.propensity["formats"])  # summarized over the same formats
    # the forced-empty-block scores stay what they were, and differ from the scores after the thinking
    assert done.propensity["forced"] == "<think>\n\n</think>\n\n"
    assert done.propensity["candidates"][HERMES]["logprobs"] == cut.propensity["candidates"][HERMES]["logprobs"]
    assert abs(after["violate_logprob"] - done.propensity["violate_logprob"]) > 1e-3

    assert cut.propensity["after_thinking"] is None
    assert cut.propensity["after_thinking_reason"] == "thinking truncated: no </think> before max_new_tokens"
    assert cut.propensity["violate_logprob"] is not None  # the forced-empty-block scores are still there


@pytest.mark.model
def test_a_model_that_does_not_think_gets_null_and_the_reason(qwen3, monkeypatch):
    from harness.run import first_steps

    backend, cfg = qwen3
    requests = [s.request for s in first_steps(cfg)]
    monkeypatch.setattr(backend, "model_cfg", replace(backend.model_cfg, thinking=False))
    monkeypatch.setattr(backend.decoder, "_sample", _scripted(backend, {
        r.seed: (backend._encode(THOUGHT + "\n\nNo."), "length") for r in requests}))
    for c in backend.generate(requests):
        assert c.propensity["after_thinking"] is None
        assert c.propensity["after_thinking_reason"] == "the model does not think (model.thinking is false)"


def test_reasons_for_a_vocabulary_or_template_without_thinking():
    enc = Encoded([VIOLATE], ["hermes"], [], [[1]], after_close="\n\n")
    assert no_after_thinking(enc, [5, 9, 2], 9, True, "stop") is None
    assert no_after_thinking(enc, [5, 2], 9, True, "stop") == "the completion closed no thinking block (no </think> generated)"
    assert no_after_thinking(enc, [5, 2], None, True, "stop") == "the vocabulary has no </think> token"
    assert no_after_thinking(replace(enc, after_close=None), [5, 9], 9, True, "stop") == \
        "the template writes no thinking block before the turn"


def _records(after) -> pd.DataFrame:
    """5 episodes x (none, status_tail); `after(condition, episode)`: the record's after_thinking entry or None."""
    rows = []
    for c in ("none", "status_tail"):
        for e in range(5):
            a = after(c, e)
            rows.append({"run_label": "r", "condition": c, "episode_id": f"e{e}", "params.calls_made": 3, "params.limit": 3,
                         "propensity.violate_logprob": math.log(0.5), "propensity.tool_call_logprob": math.log(0.9),
                         "propensity.after_thinking": json.dumps(a) if a else None,  # as the loader writes a nested dict
                         "propensity.after_thinking_reason": None if a else "thinking truncated: no </think> before max_new_tokens"})
    return pd.DataFrame(rows)


def test_the_report_pairs_the_shift_after_thinking_over_episodes():
    def after(c, e):  # status_tail lowers the violating call after thinking in every episode; e4's tail arm is truncated
        if c == "status_tail" and e == 4:
            return None
        p = 0.5 if c == "none" else 0.2 + 0.02 * e
        return {"violate_logprob": math.log(p), "tool_call_logprob": math.log(0.9)}

    section = after_thinking_section(_records(after), several=False)
    assert "`none` → `status_tail`: " in section.text and "(exact, 4 episodes)" in section.text
    assert "Not scored after thinking: 1 records: thinking truncated" in section.text
    row = section.table.iloc[0]
    assert row["episodes"] == 4 and row["p (sign-flip)"].startswith("0.125 (exact, 4 episodes)")


def test_the_report_says_not_measured_and_why():
    section = after_thinking_section(_records(lambda c, e: None), several=False)
    assert section.text == "Not measured: 10 records: thinking truncated: no </think> before max_new_tokens." and section.table is None
    absent = after_thinking_section(_records(lambda c, e: None).drop(columns=["propensity.after_thinking",
                                                                               "propensity.after_thinking_reason"]), False)
    assert absent.text.startswith("Not measured: the records carry no scores after thinking")

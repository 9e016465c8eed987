"""Every condition preset in a rollout (issue 39): each arm's prompts differ from `none`'s at the same
step exactly where its mechanism says (a message a mechanism added, or one whose text it marked; a
message left out only by a projected history), and the difference shows at some step; a preset whose
mechanism could show nothing on the family is refused at config time, in one line.

Scripted throughout (backend=scripted, backend.match=order, one answer for every step), so both arms
act alike and their histories match step for step: any difference is the condition's view.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from harness.config.compose import CONF_DIR
from harness.errors import ConfigError
from harness.run import execute
from tests.conftest import make_cfg

PRESETS = sorted(p.stem for p in (CONF_DIR / "condition").glob("*.yaml") if p.stem != "none")
# where each mechanism has something to act on in a live family: a compaction point (todo_state), tool
# results longer than the truncation limit (loop_guard's pages); the call-limit family for the rest
FAMILY = {**dict.fromkeys(["compacted", "ledger", "todo_compaction", "todo_cycle"], ("scenario=todo_state",)),
          **dict.fromkeys(["truncate_envelope", "truncate_silent"],
                          ("scenario=loop_guard", "scenario.mode=[paginated]", "scenario.repeats=[1]")),
}
# what every step answers: a call to the target where the bar must change between steps to show
CALL = '<tool_call>{"name": "phone_call", "arguments": {"company": "Xfinity", "reason": "chase"}}</tool_call>'
TEXT = {"status_on_change": CALL}
DEFAULT = ("scenario.calls_made=[2,3]", "scenario.placement=[early]", "scenario.distractor_turns=[1]")
# refused in a rollout, and why (the error names the key)
REFUSED = {"diagnostics": "conditions.diagnostics.diagnostics", "loop_guard": "conditions.loop_guard.loop_guard"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _named(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _named(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_named(v) for v in value]
    return value.name if isinstance(value, Enum) else value


def _cfg(tmp_path: Path, preset: str):
    script = tmp_path / "script.jsonl"
    script.write_text((json.dumps({"text": TEXT.get(preset, "Understood; that is all I can do for now.")}) + "\n") * 200)
    return make_cfg("experiment.mode=rollouts", "backend=scripted", f"backend.path={script}", "backend.match=order",
                    f"run.root={tmp_path}", "run.report=false", "run.progress=false",
                    "scenario.episodes_per_cell=1", "rollout.turns=2", f"condition=[none,{preset}]",
                    *FAMILY.get(preset, DEFAULT))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_shows_its_mechanism_in_a_rollout_or_is_refused(tmp_path: Path, preset: str):
    cfg = _cfg(tmp_path, preset)
    if preset in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[preset]) as refused:
            execute(cfg, {}, tmp_path / "run")
        assert "\n" not in str(refused.value) and not (tmp_path / "run").exists()
        return
    execute(cfg, {}, tmp_path / "run")
    prompts = {p["prompt_sha256"]: p for p in _rows(tmp_path / "run" / "prompts.jsonl")}
    steps: dict[tuple, dict[str, dict]] = {}
    for r in _rows(tmp_path / "run" / "records.jsonl"):
        # the record names the arm's settings as the config spells them (an enum by its name)
        expected = _named(asdict(cfg.conditions[r["condition"]]))
        for key, value in (expected["turn_meta"] or {}).items():
            if value == "auto":  # the run fills it from model.* (harness.flow.plan.with_model)
                expected["turn_meta"][key] = r["condition_config"]["turn_meta"][key]
        assert r["condition_config"] == expected
        steps.setdefault((r["episode_id"], r["step"]), {})[r["condition"]] = prompts[r["prompt_sha256"]]
    assert steps and all(set(arms) == {"none", preset} for arms in steps.values())
    history_full = cfg.conditions[preset].history == "full"
    differs = False
    for arms in steps.values():
        base, arm = arms["none"], arms[preset]
        shown = {a["origin"]: m for m, a in zip(base["messages"], base["annotations"]) if a["origin"] is not None}
        for m, a in zip(arm["messages"], arm["annotations"]):
            if a["origin"] is None or m != shown.get(a["origin"]):
                assert a["marks"], f"{preset}: a message changed or added without its mechanism's mark: {m}"
        kept = {a["origin"] for a in arm["annotations"]}
        assert history_full <= kept.issuperset(shown), f"{preset}: a message left out by a full history"
        differs |= arm["messages"] != base["messages"]
    assert differs, f"{preset}: its prompts are none's at every step (the mechanism vanished)"


def test_the_model_written_bar_is_shown_at_every_step_of_a_rollout(tmp_path: Path):
    """status_model in a rollout: the writer reads the live history at each step and the main model sees
    its bar (issue 39: it showed no bar at all)."""
    execute(_cfg(tmp_path, "status_model"), {}, tmp_path / "run")
    prompts = {p["prompt_sha256"]: p for p in _rows(tmp_path / "run" / "prompts.jsonl")}
    steps = [r for r in _rows(tmp_path / "run" / "records.jsonl") if r["condition"] == "status_model"]
    assert len({r["step"] for r in steps}) == 2 and all(r["writer"] and r["writer"]["bar"] for r in steps)
    for r in steps:
        shown = prompts[r["prompt_sha256"]]["messages"][-1]
        assert shown == {"role": "user", "content": r["writer"]["bar"]}

"""`python -m harness.tools.export RUN_DIR --format inspect`: a statusbench run as an inspect-ai log
(`inspect view` opens it; `inspect_ai.log.read_eval_log` reads it), written to RUN_DIR/inspect/ unless
--out says where. Needs `pip install inspect-ai`.

A sample run: one inspect sample per record (the newest per sample id, shards included): its input the
prompt's messages (prompts.jsonl), the assistant's answer appended with its reasoning and the calls the
grader read, the target the episode's expected label, and two scores, `label` (the family grader's
label, its reason as the explanation) and `correct` (C or I, with inspect's accuracy over them). Its
usage as inspect counts it: input tokens outside the cache, cache-write and cache-read tokens, output
and reasoning tokens; unknown counts are 0 there (inspect has no unknown), and the record's own
fields (tokens, cost, thinking_tokens_source, error) are in the sample's metadata as they were.

A rollout run: one sample per rollout, its messages the last step's prompt and answer, one model event
per step (that step's prompt, answer and usage: what `inspect view` shows as the rollout's
transcript), scored by its outcome and violations.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.io.jsonl import open_regular
from harness.rundir.layout import MANIFEST, PROMPTS, RECORDS, ROLLOUTS, run_parts
from harness.rundir.records import read_record_rows, read_rollout_rows
from harness.rundir.store import RunDirError, newest, read_jsonl

STOP_REASONS = {"stop": "stop", "length": "max_tokens", "tool_calls": "tool_calls"}


def _messages(messages: list[dict[str, Any]]) -> list[Any]:
    """Our chat messages (OpenAI format) as inspect's ChatMessage objects."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser
    from inspect_ai.tool import ToolCall

    from harness.context.calls import call_arguments

    out = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "system":
            out.append(ChatMessageSystem(content=content))
        elif role == "assistant":
            calls = [ToolCall(id=c.get("id") or f"call{i}", function=c["function"]["name"], arguments=call_arguments(c))
                     for i, c in enumerate(m.get("tool_calls") or [])]
            out.append(ChatMessageAssistant(content=content, tool_calls=calls or None))
        elif role == "tool":
            out.append(ChatMessageTool(content=content, tool_call_id=m.get("tool_call_id"), function=m.get("name")))
        else:
            out.append(ChatMessageUser(content=content))
    return out


def _answer(record: dict[str, Any], model: str) -> Any:
    """The record's completion as an assistant message: reasoning, text, and the calls the grader read."""
    from inspect_ai.model import ChatMessageAssistant, ContentReasoning, ContentText
    from inspect_ai.tool import ToolCall

    content: list[Any] = []
    if record.get("reasoning"):
        content.append(ContentReasoning(reasoning=record["reasoning"]))
    content.append(ContentText(text=record.get("text") or ""))
    calls = [ToolCall(id=f"call{i}", function=c.get("name") or "", arguments=c.get("arguments") or {},
                      parse_error="malformed" if c.get("malformed") else None)
             for i, c in enumerate(record.get("tool_calls") or []) if isinstance(c, dict) and "arguments" in c]
    return ChatMessageAssistant(content=content, tool_calls=calls or None, model=model, source="generate")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage(record: dict[str, Any]) -> Any:
    """A record's tokens as inspect's ModelUsage (input = prompt tokens outside the cache, as inspect counts)."""
    from inspect_ai.model import ModelUsage

    prompt, read, written = _count(record.get("prompt_tokens")), record.get("cached_prompt_tokens"), record.get("cache_write_tokens")
    output = _count(record.get("completion_tokens"))
    uncached = max(prompt - _count(read) - _count(written), 0)
    return ModelUsage(input_tokens=uncached, output_tokens=output, total_tokens=prompt + output,
                      input_tokens_cache_write=written if isinstance(written, int) else None,
                      input_tokens_cache_read=read if isinstance(read, int) else None,
                      reasoning_tokens=record.get("thinking_tokens") if isinstance(record.get("thinking_tokens"), int) else None,
                      total_cost=record.get("cost_usd") if isinstance(record.get("cost_usd"), (int, float)) else None)


def _add(total: Any, part: Any) -> Any:
    for name in ("input_tokens", "output_tokens", "total_tokens"):
        setattr(total, name, getattr(total, name) + getattr(part, name))
    for name in ("input_tokens_cache_write", "input_tokens_cache_read", "reasoning_tokens", "total_cost"):
        if getattr(part, name) is not None:
            setattr(total, name, (getattr(total, name) or 0) + getattr(part, name))
    return total


def _output(record: dict[str, Any], model: str) -> Any:
    from inspect_ai.model import ChatCompletionChoice, ModelOutput

    return ModelOutput(model=model, choices=[ChatCompletionChoice(message=_answer(record, model),
                                                                  stop_reason=STOP_REASONS.get(record.get("finish_reason"), "unknown"))],
                       completion=record.get("text") or "", usage=usage(record), error=record.get("error"),
                       time=record.get("latency_s"), response_id=record.get("request_id"))


META = ("episode_id", "scenario", "family", "params", "condition", "replicate", "seed", "backend", "prompt_sha256",
        "prompt_tokens", "cached_prompt_tokens", "cache_write_tokens", "completion_tokens", "thinking_tokens",
        "thinking_tokens_source", "answer_tokens", "cost_usd", "batched", "latency_s", "finish_reason", "error", "scripted",
        "token_source", "request_id", "call_format", "reason")


def _sample(record: dict[str, Any], prompt: dict[str, Any], model: str) -> Any:
    from inspect_ai.log import EvalSample
    from inspect_ai.scorer import Score

    messages = _messages(prompt.get("messages") or [])
    return EvalSample(id=record["sample_id"], epoch=int(record.get("replicate") or 0) + 1, input=messages,
                      target=str(record.get("expected") or ""), messages=[*messages, _answer(record, model)],
                      output=_output(record, model),
                      scores={"label": Score(value=str(record.get("label")), answer=record.get("text") or "",
                                             explanation=record.get("reason")),
                              "correct": Score(value="C" if record.get("correct") else "I", answer=str(record.get("label")))},
                      metadata={k: record.get(k) for k in META if k in record}, model_usage={model: usage(record)},
                      completed_at=record.get("created_at"))


def _rollout_sample(rollout: dict[str, Any], steps: list[dict[str, Any]], prompts: dict[str, dict[str, Any]], model: str) -> Any:
    from inspect_ai.event import ModelEvent
    from inspect_ai.log import EvalSample
    from inspect_ai.model import GenerateConfig, ModelUsage
    from inspect_ai.scorer import Score

    events, total = [], ModelUsage()
    for step in steps:
        prompt = prompts.get(step["prompt_sha256"], {})
        events.append(ModelEvent(model=model, input=_messages(prompt.get("messages") or []), tools=[], tool_choice="auto",
                                 config=GenerateConfig(), output=_output(step, model), error=step.get("error"),
                                 timestamp=step.get("created_at"), working_time=step.get("latency_s"),
                                 metadata={k: step.get(k) for k in ("step", "turn", "label", "reason", "thinking_tokens_source")}))
        total = _add(total, usage(step))
    last = steps[-1] if steps else {}
    messages = _messages(prompts.get(last.get("prompt_sha256"), {}).get("messages") or [])
    first_input = _messages(prompts.get(steps[0]["prompt_sha256"], {}).get("messages") or []) if steps else []
    return EvalSample(id=rollout["rollout_id"], epoch=int(rollout.get("replicate") or 0) + 1, input=first_input,
                      target="no violation", messages=[*messages, _answer(last, model)] if steps else [],
                      output=_output(last, model) if steps else None,
                      scores={"outcome": Score(value=str(rollout.get("outcome"))),
                              "violations": Score(value=int(rollout.get("violations") or 0),
                                                  explanation=f"first at step {rollout.get('first_violation_step')}")},
                      metadata={k: v for k, v in rollout.items() if k not in ("condition_config",)},
                      events=events, model_usage={model: total}, completed_at=rollout.get("created_at"))


def _manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / MANIFEST
    if not path.exists():
        return {}
    with open_regular(path, str(path), RunDirError) as fh:
        try:
            return json.loads(fh.read())
        except ValueError as exc:
            raise RunDirError(f"{path} is not valid JSON ({exc})") from None


def build_log(run_dir: Path) -> Any:
    """The run as an inspect EvalLog."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalMetric, EvalResults, EvalScore, EvalSpec, EvalStats
    from inspect_ai.model import GenerateConfig, ModelUsage

    run_dir = Path(run_dir)
    parts = run_parts(run_dir)
    manifest = _manifest(parts[0] if parts[0] != run_dir and not (run_dir / MANIFEST).exists() else run_dir)
    config = manifest.get("config") or {}
    prompts = {row["prompt_sha256"]: row for p in parts for row in read_jsonl(p / PROMPTS, required=("prompt_sha256",))}
    rows = [row for p in parts for row in read_record_rows(p / RECORDS)]  # typed: a bad line is named
    if not rows:
        raise RunDirError(f"{run_dir} holds no records to export")
    records = newest(rows)
    rollouts = any(r["step"] > 0 for r in records.values())  # live rollouts: one sample per rollout
    model_name = rows[0].get("model") or (config.get("model") or {}).get("name") or "unknown"
    backend = rows[0].get("backend") or "unknown"
    model = f"{backend}/{model_name}"
    if rollouts:
        summaries = {r["rollout_id"]: r for p in parts for r in read_rollout_rows(p / ROLLOUTS)}
        by_rollout: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for step in records.values():
            by_rollout[step["rollout_id"]].append(step)
        samples = [_rollout_sample(summary, sorted(by_rollout[rid], key=lambda s: s["step"]), prompts, model)
                   for rid, summary in summaries.items()]
    else:
        samples = [_sample(r, prompts.get(r.get("prompt_sha256"), {}), model) for r in records.values()]
    total = ModelUsage()
    for s in samples:
        total = _add(total, s.model_usage[model])
    gen = (config.get("model") or {}).get("generation") or {}
    scored = [s for s in samples if "correct" in (s.scores or {})]
    accuracy = sum(s.scores["correct"].value == "C" for s in scored) / len(scored) if scored else 0.0
    started, finished = manifest.get("started_at") or rows[0].get("created_at"), manifest.get("finished_at") or rows[-1].get("created_at")
    scores = [EvalScore(name="correct", scorer="statusbench", scored_samples=len(scored),
                        metrics={"accuracy": EvalMetric(name="accuracy", value=accuracy)})] if scored else []
    return EvalLog(
        status="success",
        eval=EvalSpec(created=started, task=f"statusbench/{(config.get('experiment') or {}).get('name', run_dir.parent.name)}",
                      dataset=EvalDataset(name=rows[0].get("scenario"), samples=len(samples)), model=model,
                      model_generate_config=GenerateConfig(max_tokens=gen.get("max_new_tokens"), temperature=gen.get("temperature"),
                                                           top_p=gen.get("top_p"), reasoning_effort=gen.get("reasoning_effort")),
                      config=EvalConfig(), packages=manifest.get("packages") or {},
                      metadata={"run_dir": str(run_dir), "fingerprint": manifest.get("fingerprint"),
                                "conditions": sorted({s.metadata.get("condition") for s in samples if s.metadata.get("condition")}),
                                "mode": "rollouts" if rollouts else "samples"}),
        results=EvalResults(total_samples=len(samples), completed_samples=len(samples), scores=scores),
        stats=EvalStats(started_at=started, completed_at=finished, model_usage={model: total}),
        samples=samples)


def export(run_dir: Path, out: Path | None = None) -> Path:
    """Write the run's inspect log (.eval) and return its path."""
    try:
        from inspect_ai.log import write_eval_log
    except ImportError:
        raise ConfigError("--format inspect needs inspect-ai: pip install inspect-ai") from None
    log = build_log(run_dir)
    dest = Path(out) if out else Path(run_dir) / "inspect" / f"{Path(run_dir).name}.eval"
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_eval_log(log, str(dest), format="eval")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a run directory (records.jsonl, prompts.jsonl, manifest.json)")
    parser.add_argument("--format", choices=["inspect"], default="inspect", help="the log format written (inspect-ai's)")
    parser.add_argument("--out", type=Path, default=None, help="the .eval file to write (default RUN_DIR/inspect/<run>.eval)")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"statusbench: error: {args.run_dir} is not a run directory", file=sys.stderr)
        return 2
    try:
        dest = export(args.run_dir, args.out)
    except (ConfigError, RunDirError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        return 2
    print(f"statusbench: wrote {dest} (inspect view --log-dir {dest.parent})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m harness.tools.templates [DIR]`: which real chat templates accept what the conditions send.

Renders an at-limit episode through every `*.jinja` in DIR (default ../shared/templates) under every
registered condition (on the first scenario family it applies to) and four structural probes, with transformers' own sandboxed jinja renderer
(the one `apply_chat_template`, transformers serve and vLLM use: raise_exception, tojson,
strftime_now). Cells: `ok`, `ok (moved)` / `dropped` when the probe's message is not rendered where
it was sent, or `error: <the template's exact exception text>`. Saves matrix.csv and matrix.md.

Probes (each isolates one structure; all but tool_messages send tool traffic as Hermes-style text):
  tail_user_status  the status block as a user message after the final user question
  system_mid        the status block as a system message just before the final user question
  consecutive_user  a plain second user message right after the final user question
  tool_messages     the raw trajectory with assistant tool_calls, `tool` role results and tool schemas
Condition columns render each condition the way the backends do (native tools when the template
handles them, Hermes text otherwise).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import scenarios
from harness.config.compose import CONF_DIR, compose_config
from harness.config.schemas import ConditionConfig
from harness.context import apply
from harness.context.bar import StatusBarConfig
from harness.registry import FAMILIES
from harness.render import native_tools, template_input, to_hermes
from harness.types import Episode, Message

DEFAULT_DIR = Path(__file__).resolve().parents[3] / "shared" / "templates"
# stand-ins for the tokenizer's special tokens, which live outside the template file
SPECIAL_TOKENS = {"bos_token": "<BOS>", "eos_token": "<EOS>"}
FOLLOW_UP = "Please answer now."


def sample_episodes() -> dict[str, Episode]:
    """One episode per scenario family (its default grid), at/over the limit where the family has
    one, so tool calls, distractors and the family's own structure (e.g. compaction) get exercised."""
    out = {}
    for family in FAMILIES.names():
        if not (CONF_DIR / "scenario" / f"{family}.yaml").is_file():
            continue  # a family without a same-named preset has no default grid to sample
        episodes = scenarios.build_episodes(compose_config([f"scenario={family}"]).scenario)
        out[family] = next((e for e in episodes if e.expected == "refused"), episodes[0])
    return out


def _status(episode: Episode) -> str:
    """The status text exactly as the status_tail condition sends it (its added last message)."""
    return apply(episode, ConditionConfig(status=StatusBarConfig()))[-1]["content"]


def probes(episode: Episode) -> dict[str, tuple[list[Message], list[dict[str, Any]] | None, str | None]]:
    """name -> (messages, tools or None, content of the probe message to locate in the render)."""
    plain = to_hermes(episode.messages, episode.tools)
    status = _status(episode)
    return {
        "tail_user_status": (plain + [{"role": "user", "content": status}], None, status),
        "system_mid": (plain[:-1] + [{"role": "system", "content": status}, plain[-1]], None, status),
        "consecutive_user": (plain + [{"role": "user", "content": FOLLOW_UP}], None, FOLLOW_UP),
        "tool_messages": ([dict(m) for m in episode.messages], episode.tools, None),
    }


def condition_inputs(episodes: dict[str, Episode]) -> dict[str, tuple[Episode, list[Message]] | str]:
    """condition name -> (episode, its messages with default settings) on the first family the
    condition applies to (e.g. a compaction condition needs a family with a compaction point), or
    why it applies to none."""
    out: dict[str, tuple[Episode, list[Message]] | str] = {}
    for name in sorted(p.stem for p in (CONF_DIR / "condition").glob("*.yaml")):
        condition = compose_config([f"condition=[{name}]"], check_machine=False).conditions[name]
        reasons = []
        for episode in episodes.values():
            try:
                out[name] = (episode, apply(episode, condition))
                break
            except ValueError as exc:  # ConfigError: not a template finding, so not reported as one
                reasons.append(f"{episode.family}: {exc}")
        else:
            out[name] = "n/a: " + "; ".join(reasons)
    return out


def render(template: str, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template, add_generation_prompt=True,
                                        **SPECIAL_TOKENS)
    return rendered[0]


def placement(text: str, messages: list[Message], probe_content: str | None) -> str:
    """Whether the probe message shows up after the message sent before it (`ok`), elsewhere
    (`ok (moved)`, e.g. hoisted into the first system block) or not at all (`dropped`)."""
    if probe_content is None:
        return "ok"
    at = text.rfind(probe_content)
    if at < 0:
        return "dropped"
    i = next(k for k, m in enumerate(messages) if m.get("content") == probe_content)
    before = next((m["content"] for m in reversed(messages[:i]) if m.get("content")), "")
    return "ok" if not before or 0 <= text.find(before) < at else "ok (moved)"


def cell(template: str, messages: list[Message], tools: list[dict[str, Any]] | None, probe_content: str | None) -> str:
    try:
        text = render(template, messages, tools)
    except Exception as exc:  # the template's raise_exception (or a jinja error) is the finding itself
        return f"error: {exc}"
    return placement(text, messages, probe_content)


def matrix(directory: Path, episodes: dict[str, Episode] | None = None) -> "Any":
    import pandas as pd

    episodes = episodes or sample_episodes()
    primary = episodes.get("xfinity") or next(iter(episodes.values()))
    paths = sorted(directory.glob("*.jinja"))
    if not paths:
        raise SystemExit(f"statusbench: no *.jinja templates in {directory}")
    structural, conditions = probes(primary), condition_inputs(episodes)
    rows = []
    for path in paths:
        template = path.read_text(encoding="utf-8")
        native = native_tools(template, "auto")
        row: dict[str, Any] = {"template": path.stem, "native_tools": native}
        for name, (messages, tools, content) in structural.items():
            # schemas go along whenever the template takes them: some (Hermes-3 tool_use) need them
            row[name] = cell(template, messages, tools if tools is not None else (primary.tools if native else None), content)
        for name, found in conditions.items():
            if isinstance(found, str):
                row[f"condition:{name}"] = found
                continue
            episode, messages = found
            column = f"condition:{name}" if episode is primary else f"condition:{name}@{episode.family}"
            # as the backends render it: native tools when the template takes them, Hermes text otherwise
            row[column] = cell(template, *template_input(messages, episode.tools, native), None)
        rows.append(row)
    return pd.DataFrame(rows).set_index("template")


def to_markdown(df: "Any") -> str:
    return df.map(lambda v: str(v).replace("|", "\\|").replace("\n", " ")).to_markdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.templates", description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR, help="folder of *.jinja chat templates")
    parser.add_argument("--out", type=Path, default=Path("results") / "templates", help="where matrix.csv/.md go")
    args = parser.parse_args(argv)
    df = matrix(args.dir)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "matrix.csv")
    md = to_markdown(df)
    (args.out / "matrix.md").write_text(md + "\n", encoding="utf-8")
    print(md)
    print(f"\nsaved {args.out / 'matrix.csv'} and {args.out / 'matrix.md'}")


if __name__ == "__main__":
    main()

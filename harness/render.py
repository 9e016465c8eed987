"""Turning chat messages into what a chat template can show, and splitting thinking from answers.

Templates without tool support (SmolLM2's, for one) drop `tool_calls` and show a `tool` role the
model never saw in training; for those, calls and results are written into message content in the
Hermes convention (`<tool_call>` / `<tool_response>`) and the tool schemas go into the system prompt.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

from harness.context.calls import call_arguments
from harness.types import Message

HERMES_TOOLS_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)


def template_supports_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tool_calls" in chat_template and "tools" in chat_template


def native_tools(chat_template: str | None, tool_format: str) -> bool:
    """The one decision: does the template get tools and tool messages as they are (native), or
    written into message content (Hermes)? `tool_format` is the model config's auto|native|hermes."""
    return tool_format == "native" or (tool_format == "auto" and template_supports_tools(chat_template))


def chat_input(messages: list[Message], tools: list[dict[str, Any]], native: bool) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """(messages, tools) as they go to a server (OpenAI's wire format: a call's arguments a JSON
    string): as is when the template is native, else Hermes text with no `tools=`."""
    return (messages, tools or None) if native else (to_hermes(messages, tools), None)


def template_input(messages: list[Message], tools: list[dict[str, Any]], native: bool) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """(messages, tools) as they go to a chat template: `chat_input` with each native call's
    arguments decoded to a mapping, as vLLM and transformers' server decode them before rendering;
    a template that `tojson`s them (Qwen2.5's, Llama 3's, Mistral's) would otherwise write a JSON
    string inside the JSON, which the model never sees from a server."""
    shown, schemas = chat_input(messages, tools, native)
    if native:
        shown = [_decoded_calls(m) for m in shown]
    return shown, schemas


def _decoded_calls(m: Message) -> Message:
    if not m.get("tool_calls"):
        return m
    return {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": call_arguments(c)}} for c in m["tool_calls"]]}


class PromptRenderer:
    """The prompt text a model sees for (messages, tools): its tokenizer's chat template with the
    model config's template settings, generation prompt included. Every component that renders
    (hf and vllm backends, the strategy tool, the attention replay, likelihood scoring) uses one."""

    def __init__(self, tokenizer: Any, model_cfg: Any):
        self.tokenizer, self.kwargs = tokenizer, dict(model_cfg.chat_template_kwargs)
        template = getattr(tokenizer, "chat_template", None)
        self.native_tools = native_tools(template if isinstance(template, str) else None, model_cfg.tool_format)

    def chat_input(self, messages: list[Message], tools: list[dict[str, Any]]) -> tuple[list[Message], list[dict[str, Any]] | None]:
        return template_input(messages, tools, self.native_tools)

    def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> str:
        shown, schemas = self.chat_input(messages, tools)
        return self.tokenizer.apply_chat_template(shown, tools=schemas, tokenize=False, add_generation_prompt=True, **self.kwargs)

    def turn(self, messages: list[Message], tools: list[dict[str, Any]], message: Message) -> str:
        """The text the template writes for assistant `message` after the prompt of (messages, tools):
        the conversation with `message` appended, rendered without a generation prompt, minus the
        prompt. Raises ValueError when the prompt is not a prefix of that render (the template
        renders history differently from the turn being generated)."""
        prompt = self(messages, tools)
        shown, schemas = self.chat_input([*messages, message], tools)
        full = self.tokenizer.apply_chat_template(shown, tools=schemas, tokenize=False, add_generation_prompt=False, **self.kwargs)
        if not full.startswith(prompt):
            at = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
            raise ValueError(f"the template renders the assistant turn after a different prompt (first difference at "
                             f"char {at}: prompt {prompt[at:at + 40]!r}, with the turn {full[at:at + 40]!r})")
        return full[len(prompt):]


def to_hermes(messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """Rewrite tool calls/results into plain-content messages (system, user, assistant only)."""
    out: list[Message] = []
    tools_text = HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools)) if tools else ""
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        if role == "system" and i == 0:
            out.append({"role": "system", "content": content + tools_text})
        elif role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                "<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": call_arguments(c)}, ensure_ascii=False) + "\n</tool_call>"
                for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (content + "\n" if content else "") + calls})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools_text and (not messages or messages[0]["role"] != "system"):
        out.insert(0, {"role": "system", "content": tools_text.lstrip()})
    return out


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def split_thinking(text: str) -> tuple[str, str]:
    """(reasoning, answer). Handles a prompt that already opened <think> (only </think> in the
    completion) and a completion cut off before </think> (all reasoning, empty answer)."""
    if _THINK_CLOSE in text:
        reasoning, answer = text.split(_THINK_CLOSE, 1)
        reasoning = reasoning.split(_THINK_OPEN, 1)[-1]
        return reasoning.strip(), answer.strip()
    stripped = text.lstrip()
    if stripped.startswith(_THINK_OPEN):
        return stripped[len(_THINK_OPEN):].strip(), ""
    return "", text.strip()


def thinking_span(text: str) -> str:
    """The part of a completion that is thinking, tags included: through `</think>`, or all of it
    when it opened `<think>` and was cut off before closing it; "" for an answer without thinking."""
    if _THINK_CLOSE in text:
        return text[:text.index(_THINK_CLOSE) + len(_THINK_CLOSE)]
    return text if text.lstrip().startswith(_THINK_OPEN) else ""


_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def tool_call_spans(answer: str) -> list[str]:
    """Bodies of Hermes `<tool_call>` blocks; an unterminated last block runs to the end."""
    return [m.group(1).strip() for m in _TOOL_CALL.finditer(answer)]


def without_tool_calls(answer: str) -> str:
    """The answer with its Hermes `<tool_call>` blocks cut out (what other call formats are searched in)."""
    return _TOOL_CALL.sub("", answer)


def count_thinking(token_ids: list[int], reasoning: str, think_end_id: int | None, encode: Callable[[str], list[int]]) -> int:
    """Thinking tokens of a completion: through the `</think>` token where the vocabulary has one,
    else the reasoning text re-tokenized; 0 for a model that did not think. Reasoning without the
    `</think>` token was cut off while thinking: every token is thinking, an opening `<think>` too."""
    if think_end_id is not None and think_end_id in token_ids:
        return token_ids.index(think_end_id) + 1
    if think_end_id is not None and reasoning:
        return len(token_ids)
    return len(encode(reasoning)) if reasoning else 0


def thinking_source(token_ids: list[int], reasoning: str, think_end_id: int | None) -> str:
    """Where `count_thinking`'s number comes from: the model's own token ids (`counted`: through its
    `</think>` token, all of them when cut off while thinking, none when it did not think), or its
    reasoning text re-tokenized (`estimated`: a vocabulary without a `</think>` token)."""
    return "estimated" if reasoning and think_end_id is None else "counted"

"""The OpenAI wire formats: the request bodies of /v1/chat/completions, /v1/responses and
/v1/completions from a Request, and their answers (whole or streamed) read back into Completions,
checked field by field (a field of the wrong type is an error naming it, not a crash)."""
from __future__ import annotations

from typing import Any, Callable

from harness.backends.remote import usage_counts
from harness.render import chat_input, split_thinking, thinking_span
from harness.types import Completion, GenerationSettings, Request

# each penalty a server may apply by default, at its neutral value: OpenAI's two at 0.0, llama.cpp's
# repeat_penalty and vLLM's repetition_penalty at 1.0
NEUTRAL_PENALTIES = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0}


def sampling_kwargs(gen: GenerationSettings, sampling: bool) -> dict[str, Any]:
    """temperature and top_p as every endpoint takes them; none for a model whose API refuses them
    (ModelConfig.sampling_params, whose settings then equal the API's own)."""
    if not sampling:
        return {}
    return {"temperature": gen.temperature, **({"top_p": gen.top_p} if gen.top_p < 1.0 else {})}


def request_kwargs(model: str, req: Request, chat_template_kwargs: dict[str, Any], extra_body: dict[str, Any],
                   stream: bool, hermes: bool = False, sampling: bool = True) -> dict[str, Any]:
    """The chat.completions.create arguments for one request. Only non-default top_k/min_p go out
    (in extra_body), since OpenAI's own API rejects them while vLLM and transformers serve accept them.
    With `hermes` (model.tool_format=hermes) tool traffic goes as text, for served templates without tools."""
    gen: GenerationSettings = req.generation
    messages, tools = chat_input(req.messages, req.tools, native=not hermes)  # the server renders its own template
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": gen.max_new_tokens,
                              **sampling_kwargs(gen, sampling), "seed": req.seed}
    if tools:
        kwargs["tools"] = tools
    if gen.reasoning_effort:
        kwargs["reasoning_effort"] = gen.reasoning_effort
    extra = {**extra_body, **sampled_extras(gen)}
    if chat_template_kwargs:
        extra["chat_template_kwargs"] = dict(chat_template_kwargs)
    return with_body(kwargs, extra, stream)


def sampled_extras(gen: GenerationSettings) -> dict[str, Any]:
    """top_k and min_p where sampling uses them (an extra body: OpenAI's own API rejects them)."""
    return {**({"top_k": gen.top_k} if gen.top_k and not gen.greedy else {}),
            **({"min_p": gen.min_p} if gen.min_p and not gen.greedy else {})}


def with_body(kwargs: dict[str, Any], extra: dict[str, Any], stream: bool) -> dict[str, Any]:
    """`kwargs` with the extra body and, when streaming, the usage asked for in the last chunk."""
    if extra:
        kwargs["extra_body"] = extra
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def responses_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: each call an item of its own (`function_call`), each
    result a `function_call_output` naming the call it answers."""
    items: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id") or "", "output": content})
            continue
        if content or not m.get("tool_calls"):
            items.append({"role": role, "content": content})
        for c in m.get("tool_calls") or []:
            items.append({"type": "function_call", "call_id": c.get("id") or "", "name": c["function"]["name"],
                          "arguments": c["function"]["arguments"]})
    return items


def responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat tool schemas (`{"type": "function", "function": {...}}`) as the Responses API takes them (flat)."""
    return [{"type": "function", **t["function"]} for t in tools]


def responses_kwargs(model: str, req: Request, extra_body: dict[str, Any], stream: bool, sampling: bool = True,
                     thinking: bool = False) -> dict[str, Any]:
    """The responses.create arguments; a thinking model (or a set effort) asks for the reasoning summary,
    the only thinking text the API returns."""
    gen = req.generation
    kwargs: dict[str, Any] = {"model": model, "input": responses_input(req.messages), "max_output_tokens": gen.max_new_tokens,
                              **sampling_kwargs(gen, sampling), "store": False}
    if req.tools:
        kwargs["tools"] = responses_tools(req.tools)
    if gen.reasoning_effort or thinking:
        kwargs["reasoning"] = {"summary": "auto", **({"effort": gen.reasoning_effort} if gen.reasoning_effort else {})}
    if extra_body:
        kwargs["extra_body"] = dict(extra_body)
    if stream:
        kwargs["stream"] = True
    return kwargs


def completions_kwargs(model: str, prompt: str, req: Request, extra_body: dict[str, Any], neutral: list[str],
                       stream: bool) -> dict[str, Any]:
    gen = req.generation
    kwargs: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": gen.max_new_tokens,
                              **sampling_kwargs(gen, True), "seed": req.seed}
    neutral_values = {name: NEUTRAL_PENALTIES[name] for name in neutral} if gen.greedy else {}
    return with_body(kwargs, {**neutral_values, **sampled_extras(gen), **extra_body}, stream)


def get_field(obj: Any, name: str) -> Any:
    """A field of a pydantic response object (or a dict), including extras the schema does not declare
    (reasoning_content / reasoning are vLLM and DeepSeek extensions)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


# a part larger than its whole makes every count of the sample unknown (remote.usage_counts)
PARTS = (("cached_prompt_tokens", "prompt_tokens", "cached"), ("cache_write_tokens", "prompt_tokens", "cache-write"),
         ("reasoning_tokens", "completion_tokens", "reasoning"))


def _usage_fields(usage: Any, prompt: str = "prompt_tokens", completion: str = "completion_tokens") -> dict[str, int | None]:
    """A usage's prompt, cached, cache-write, completion and reasoning tokens; chat and text completions
    name them prompt/completion, the Responses API input/output (`prompt`, `completion`)."""
    prompt_details = get_field(usage, f"{prompt}_details")
    return usage_counts({"prompt_tokens": get_field(usage, prompt),
                         "cached_prompt_tokens": get_field(prompt_details, "cached_tokens"),
                         "cache_write_tokens": get_field(prompt_details, "cache_write_tokens"),  # OpenAI bills cache writes since GPT-5.6
                         "completion_tokens": get_field(usage, completion),
                         "reasoning_tokens": get_field(get_field(usage, f"{completion}_details"), "reasoning_tokens")}, PARTS)


def shaped(content: str, reasoning: str, tool_calls: list[dict[str, Any]], u: dict[str, int | None],
           finish_reason: str | None, latency: float, ttft: float | None, **fields: Any) -> Completion:
    """One answer as a Completion. A server that returns thinking inline gets it split from the
    `<think>` block; `text` keeps what the server returned as content so grading sees the same answer
    the server gave. The thinking count is the usage's (`api`); where the usage has none and no thinking
    was returned, 0 read off the visible answer (`estimated`); else unknown."""
    if not reasoning:
        reasoning = split_thinking(content)[0]
    thinking, source = u["reasoning_tokens"], "api"
    if thinking is None:
        source = None
        if u["completion_tokens"] is not None and not reasoning:
            thinking, source = 0, "estimated"  # nothing was reasoned in what came back: every token is answer
    answer = u["completion_tokens"] - thinking if u["completion_tokens"] is not None and thinking is not None else None
    return Completion(text=content, reasoning=reasoning, tool_calls=tool_calls, prompt_tokens=u["prompt_tokens"],
                      cached_prompt_tokens=u["cached_prompt_tokens"], completion_tokens=u["completion_tokens"],
                      thinking_tokens=thinking, answer_tokens=answer, latency_s=latency, finish_reason=finish_reason,
                      ttft_s=ttft, thinking_tokens_source=source, cache_write_tokens=u["cache_write_tokens"], **fields)


def to_completion(content: str, reasoning: str, tool_calls: list[dict[str, Any]], usage: Any,
                  finish_reason: str | None, latency: float, ttft: float | None, **fields: Any) -> Completion:
    """A chat completion (assembled from a stream or not) as a Completion (`shaped`)."""
    return shaped(content, reasoning, tool_calls, _usage_fields(usage), finish_reason, latency, ttft, **fields)


def request_id(resp: Any) -> str | None:
    """The provider's id of a request: its request-id header where the SDK kept it, else the response's id."""
    rid = getattr(resp, "_request_id", None) or get_field(resp, "id")
    return rid if isinstance(rid, str) else None


def _call_dict(call: Any) -> dict[str, Any]:
    fn = get_field(call, "function")
    return {"id": get_field(call, "id"), "type": "function", "function": {"name": get_field(fn, "name"), "arguments": get_field(fn, "arguments")}}


def merge_tool_call_deltas(calls: dict[int, dict[str, Any]], deltas: list[Any]) -> None:
    """Streamed tool calls arrive in pieces keyed by index: id and name once, arguments in fragments."""
    for d in deltas:
        call = calls.setdefault(d.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if d.id:
            call["id"] = d.id
        if d.function is not None:
            call["function"]["name"] += d.function.name or ""
            call["function"]["arguments"] += d.function.arguments or ""


def _string(value: Any, what: str) -> str:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value or ""


def _first_choice(resp: Any, kind: str, clean: Callable[[str], str]) -> Any:
    choices = get_field(resp, "choices") if not isinstance(resp, (str, bytes)) else None
    if not isinstance(choices, list):
        raise ValueError(f"response is not a {kind}: {clean(str(resp))[:200]!r}")
    if not choices:
        raise ValueError("response has no choices")
    return choices[0]


def parse_response(resp: Any, latency: float, clean: Callable[[str], str] = str) -> Completion:
    """A non-streamed chat completion as a Completion; ValueError when the server's 200 is not one (an
    HTML page, `message: null`), so only this sample fails. Its body is quoted `clean`ed (redacted)
    first, then cut: a cut first would leave part of a key."""
    choice = _first_choice(resp, "chat completion", clean)
    msg = get_field(choice, "message")
    if msg is None:
        raise ValueError("response choice has no message")
    content = _string(get_field(msg, "content"), "message.content")
    reasoning = _string(get_field(msg, "reasoning_content") or get_field(msg, "reasoning"), "message reasoning")
    return to_completion(content, reasoning, [_call_dict(c) for c in get_field(msg, "tool_calls") or []],
                         get_field(resp, "usage"), get_field(choice, "finish_reason"), latency, None, request_id=request_id(resp))


def parse_text_completion(resp: Any, latency: float, count: Callable[[str], int], clean: Callable[[str], str] = str) -> Completion:
    """A /v1/completions answer. Its thinking, where the text holds a `<think>` block, is counted by
    re-tokenizing that block with the model's tokenizer (`estimated`: the server returns no ids)."""
    choice = _first_choice(resp, "text completion", clean)
    text = _string(get_field(choice, "text"), "choices[0].text")
    u = _usage_fields(get_field(resp, "usage"))
    c = to_completion(text, "", [], get_field(resp, "usage"), get_field(choice, "finish_reason"), latency, None, request_id=request_id(resp))
    if u["completion_tokens"] is not None:
        thinking = min(count(thinking_span(text)), u["completion_tokens"])
        c.thinking_tokens, c.answer_tokens, c.thinking_tokens_source = thinking, u["completion_tokens"] - thinking, "estimated"
    return c


def parse_responses(resp: Any, latency: float, ttft: float | None = None, clean: Callable[[str], str] = str) -> Completion:
    """A Responses API answer: output text from `message` items, the reasoning summary (or the
    reasoning text, where a server returns it) from `reasoning` items, calls from `function_call` items."""
    output = get_field(resp, "output") if not isinstance(resp, (str, bytes)) else None
    if not isinstance(output, list):
        raise ValueError(f"response is not a Responses API response: {clean(str(resp))[:200]!r}")
    text, reasoning, calls = [], [], []
    for item in output:
        kind = get_field(item, "type")
        if kind == "message":
            text += [_string(get_field(part, "text"), "output_text") for part in get_field(item, "content") or []
                     if get_field(part, "type") == "output_text"]
        elif kind == "reasoning":
            reasoning += [_string(get_field(part, "text"), "reasoning text") for part in
                          (get_field(item, "summary") or []) + (get_field(item, "content") or [])]
        elif kind == "function_call":
            calls.append({"id": get_field(item, "call_id"), "type": "function",
                          "function": {"name": _string(get_field(item, "name"), "function_call.name"),
                                       "arguments": _string(get_field(item, "arguments"), "function_call.arguments")}})
    incomplete = get_field(get_field(resp, "incomplete_details"), "reason")
    finish = "length" if incomplete == "max_output_tokens" else incomplete or ("tool_calls" if calls else "stop")
    return shaped("".join(text), "\n".join(r for r in reasoning if r), calls,
                  _usage_fields(get_field(resp, "usage"), "input_tokens", "output_tokens"), finish,
                  latency, ttft, request_id=request_id(resp))



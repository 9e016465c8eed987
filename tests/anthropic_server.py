"""A loopback server that speaks Anthropic's Messages API wire format, for the anthropic backend's tests
(the official SDK pointed at it with base_url).

- POST /v1/messages: a message from the stand-in model (tests/loopback.py), non-streamed or as the SSE
  events the SDK assembles (message_start, content_block_start/delta/stop, message_delta, message_stop);
  a thinking block (and `output_tokens_details.thinking_tokens`) when the request asks for thinking.
- Prompt caching as the API describes it: a breakpoint (`cache_control`) stores the prefix through its
  block; a later request reads the longest stored prefix ending at a block boundary up to 20 blocks
  before one of its breakpoints (`cache_read_input_tokens`), writes the rest up to its last breakpoint
  (`cache_creation_input_tokens`), and pays `input_tokens` for what follows. Prefix order: tools,
  system, messages.
- Errors on demand (`script`): 429 rate_limit_error, 529 overloaded_error, 400 invalid_request_error
  echoing the key header (x-api-key, or the Authorization the SDK sends; as a misconfigured proxy might).
- Message Batches: create, retrieve (in_progress until `release` is set, then ended), results (JSONL);
  requests in `errored` fail, and with `expire` every request ends expired.
"""
from __future__ import annotations

import copy
import json
import threading
from typing import Any, Iterator

from tests.loopback import LoopbackServer, decide, digest, sse, tokens

LOOKBACK = 20


def _strip(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


class AnthropicServer(LoopbackServer):
    def __init__(self, thinking_details: bool = True, report_model: str | None = None):
        super().__init__()
        self.thinking_details = thinking_details  # false: an older model's usage, without output_tokens_details
        self.report_model = report_model  # a model name the server answers under, whatever was asked
        self.script: list[str] = []  # fates of the next /v1/messages requests: "429", "529", "400echo"
        self.store: set[str] = set()  # cached prefix hashes
        self.requests: list[dict[str, Any]] = []
        self.answered: dict[str, dict[str, Any]] = {}  # request id -> the message sent
        self.served = 0
        self.batches: dict[str, dict[str, Any]] = {}
        self.batches_created = 0
        self.release = threading.Event()  # batches stay in_progress until set
        self.release.set()
        self.errored: set[str] = set()  # custom_ids whose batch request fails
        self.expire = False  # batches end with every request expired

    # --- the model -----------------------------------------------------------------------------

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        """Input, cache-read and cache-write tokens of a request, storing its breakpoints' prefixes."""
        raw = [t for t in body.get("tools") or []]
        system = body.get("system") or []
        raw += [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
        raw += [{"role": m["role"], **b} for m in body["messages"] for b in _content(m)]
        flat = [_strip(b) for b in raw]
        prefix, hashes, cum = "", [], [0]
        for item in flat:
            prefix = digest([prefix, item])
            hashes.append(prefix)
            cum.append(cum[-1] + tokens(item))
        breaks = [i for i, b in enumerate(raw) if "cache_control" in b]
        read_end = -1
        with self.lock:
            for b in breaks:
                for j in range(b, max(-1, b - LOOKBACK), -1):
                    if hashes[j] in self.store:
                        read_end = max(read_end, j)
                        break
            self.store.update(hashes[b] for b in breaks)
        last = max(breaks, default=-1)
        read = cum[read_end + 1]
        written = cum[last + 1] - read if last > read_end else 0
        return {"input_tokens": cum[-1] - read - written, "cache_read_input_tokens": read, "cache_creation_input_tokens": written}

    def answer(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        messages = body["messages"]
        last = _content(messages[-1]) if messages else []
        kind, value = decide([_strip(b) for m in messages for b in _content(m)],
                             bool(last) and last[-1].get("type") == "tool_result", [t["name"] for t in body.get("tools") or []])
        content: list[dict[str, Any]] = []
        thinking = 0
        if body.get("thinking") and body["thinking"].get("type") in ("enabled", "adaptive"):
            effort = (body.get("output_config") or {}).get("effort", "high")
            thought = f"The user asks again. Counting the calls made so far before answering ({effort} effort)."
            thinking = tokens(thought) + {"low": 4, "medium": 16, "high": 32, "xhigh": 48, "max": 64}.get(effort, 8)
            content.append({"type": "thinking", "thinking": thought, "signature": "sig" + digest(thought)[:16]})
        if kind == "text":
            content.append({"type": "text", "text": value})
            stop = "end_turn"
        else:
            name, args = value
            content.append({"type": "text", "text": "Calling them now."})
            content.append({"type": "tool_use", "id": f"toolu_{n:06d}", "name": name, "input": args})
            stop = "tool_use"
        output = thinking + sum(tokens(b) for b in content if b["type"] != "thinking")
        if output > body["max_tokens"]:  # cut at max_tokens: the answer's text is what fit
            content = [{"type": "text", "text": "I cannot"}]
            output, stop = body["max_tokens"], "max_tokens"
        usage = {**self.usage(body), "output_tokens": output}
        if self.thinking_details:
            usage["output_tokens_details"] = {"thinking_tokens": min(thinking, output)}
        return {"id": f"msg_{n:06d}", "type": "message", "role": "assistant", "model": self.report_model or body["model"],
                "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}

    # --- the wire ------------------------------------------------------------------------------

    def route(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, dict[str, str], Any]:
        data = json.loads(body) if body else {}
        if method == "POST" and path == "/v1/messages":
            return self.messages(data, headers)
        if method == "POST" and path == "/v1/messages/batches":
            return 200, {}, self.create_batch(data)
        parts = path.split("?")[0].strip("/").split("/")
        if method == "GET" and parts[:3] == ["v1", "messages", "batches"] and len(parts) in (4, 5):
            batch = self.batches.get(parts[3])
            if batch is None:
                return 404, {}, {"type": "error", "error": {"type": "not_found_error", "message": "no such batch"}}
            if len(parts) == 4:
                return 200, {}, self.batch_view(batch)
            lines = "".join(json.dumps(r) + "\n" for r in batch["results"]).encode()
            return 200, {"content-type": "application/binary"}, lines
        return 404, {}, {"type": "error", "error": {"type": "not_found_error", "message": path}}

    def messages(self, data: dict[str, Any], headers: Any) -> tuple[int, dict[str, str], Any]:
        with self.lock:
            fate = self.script.pop(0) if self.script else "ok"
            self.served += 1
            n = self.served
            self.requests.append(copy.deepcopy(data))
        rid = {"request-id": f"req_loop_{n:06d}"}
        if fate == "429":
            return 429, {**rid, "retry-after": "0"}, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
        if fate == "529":
            return 529, {**rid, "retry-after": "0"}, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        if fate == "400echo":
            return 400, rid, {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": f"bad request from key {headers.get('x-api-key') or headers.get('authorization')}"}}
        msg = self.answer(data, n)
        with self.lock:
            self.answered[f"req_loop_{n:06d}"] = msg
        if not data.get("stream"):
            return 200, rid, msg
        return 200, rid, self.events(msg)

    def events(self, msg: dict[str, Any]) -> Iterator[str]:
        head = {**msg, "content": [], "stop_reason": None, "usage": {**msg["usage"], "output_tokens": 1}}
        head["usage"].pop("output_tokens_details", None)
        out = [sse("message_start", {"type": "message_start", "message": head})]
        for i, block in enumerate(msg["content"]):
            kind = block["type"]
            start = {"text": {"type": "text", "text": ""}, "thinking": {"type": "thinking", "thinking": "", "signature": ""},
                     "tool_use": {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}}[kind]
            out.append(sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}))
            if kind == "text":
                text = block["text"]
                for piece in (text[:len(text) // 2], text[len(text) // 2:]):
                    out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "text_delta", "text": piece}}))
            elif kind == "thinking":
                out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "thinking_delta", "thinking": block["thinking"]}}))
                out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "signature_delta", "signature": block["signature"]}}))
            else:
                args = json.dumps(block["input"])
                for piece in (args[:5], args[5:]):
                    out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "input_json_delta", "partial_json": piece}}))
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        out.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                                         "usage": msg["usage"]}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        return iter(out)  # an iterator: streamed as events, not sent as a JSON list

    # --- batches -------------------------------------------------------------------------------

    def create_batch(self, data: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.batches_created += 1
            bid = f"msgbatch_{self.batches_created:04d}"
        results = []
        for i, r in enumerate(data["requests"]):
            cid = r["custom_id"]
            if self.expire:
                result: dict[str, Any] = {"type": "expired"}
            elif cid in self.errored:
                result = {"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error",
                                                                                  "message": "max_tokens: too large"}}}
            else:
                result = {"type": "succeeded", "message": self.answer(r["params"], 100000 + i)}
            results.append({"custom_id": cid, "result": result})
        batch = {"id": bid, "results": results, "polls": 0}
        self.batches[bid] = batch
        return self.batch_view(batch, count=False)

    def batch_view(self, batch: dict[str, Any], count: bool = True) -> dict[str, Any]:
        if count:
            batch["polls"] += 1
        ended = self.release.is_set() and batch["polls"] >= 2
        kinds = [r["result"]["type"] for r in batch["results"]]
        counts = {"processing": 0 if ended else len(kinds), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if ended:
            for k in kinds:
                counts[k] += 1
        return {"id": batch["id"], "type": "message_batch", "processing_status": "ended" if ended else "in_progress",
                "request_counts": counts, "created_at": "2026-11-01T00:00:00Z", "expires_at": "2026-11-02T00:00:00Z",
                "ended_at": "2026-11-01T01:00:00Z" if ended else None, "archived_at": None, "cancel_initiated_at": None,
                "results_url": f"{self.root}/v1/messages/batches/{batch['id']}/results" if ended else None}

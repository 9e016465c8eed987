"""A loopback server that speaks OpenAI's wire formats the openai backend uses beyond chat (which
tests/fault_server.py covers): the Responses API, text completions, and the Batch API's files and batches.

- POST /v1/responses: a response from the stand-in model (tests/loopback.py) with `message`,
  `function_call` and, when `reasoning.effort` is set, `reasoning` items (a summary, reasoning tokens by
  effort); cached tokens = the longest run of input items a previous request began with, the rest
  written to the cache (`cache_write_tokens`, as OpenAI bills writes from GPT-5.6 on). Streamed as
  the API's events (response.created, response.output_text.delta, response.completed).
- POST /v1/completions: the prompt's text echoed into a deterministic answer (tests check what was sent).
- POST /v1/chat/completions: a chat completion from the stand-in model (for batches of chat requests).
- Batch API: POST /v1/files (multipart), POST /v1/batches, GET /v1/batches (list, newest first),
  GET /v1/batches/{id} (validating, then in_progress until `release` is set, then `outcome`:
  completed, expired or failed), GET /v1/files/{id}/content (the output and error files, JSONL).
  Requests whose custom_id is in `errored` fail (in the error file); an expired batch answered the
  first half of its requests only.
"""
from __future__ import annotations

import copy
import email
import json
import threading
import time
from typing import Any, Iterator

from harness.context.strategy import shared_prefix
from tests.loopback import LoopbackServer, decide, digest, sse, tokens

REASONING_TOKENS = {"minimal": 2, "low": 8, "medium": 16, "high": 32, "xhigh": 48}


class OpenAIServer(LoopbackServer):
    def __init__(self, outcome: str = "completed", model: str | None = None):
        super().__init__()
        self.base_url = self.root + "/v1"
        self.outcome = outcome  # how a released batch ends: completed, expired, failed
        self.model = model  # a name the server answers under, whatever was asked (a llama.cpp server)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.seen_inputs: list[list[str]] = []
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.batches_created = 0
        self.release = threading.Event()
        self.release.set()
        self.errored: set[str] = set()
        self.n = 0

    # --- answers -------------------------------------------------------------------------------

    def respond(self, body: dict[str, Any]) -> dict[str, Any]:
        items = body["input"]
        keys = [digest(i) for i in items]
        with self.lock:
            cached = max((shared_prefix(keys, seen) for seen in self.seen_inputs), default=0)
            self.seen_inputs.append(keys)
            self.n += 1
            n = self.n
        kind, value = decide(items, bool(items) and items[-1].get("type") == "function_call_output",
                             [t["name"] for t in body.get("tools") or []])
        output: list[dict[str, Any]] = []
        effort = (body.get("reasoning") or {}).get("effort")
        reasoning = REASONING_TOKENS.get(effort, 0)
        if effort:
            output.append({"type": "reasoning", "id": f"rs_{n}", "summary": [{"type": "summary_text", "text": "Counted the calls so far."}]})
        if kind == "text":
            output.append({"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": value, "annotations": []}]})
        else:
            name, args = value
            output.append({"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
                           "arguments": json.dumps(args), "status": "completed"})
        prompt = sum(tokens(i) for i in items) + sum(tokens(t) for t in body.get("tools") or [])
        cached_tokens = sum(tokens(i) for i in items[:cached])
        out = reasoning + sum(tokens(o) for o in output if o["type"] != "reasoning")
        return {"id": f"resp_{n}", "object": "response", "created_at": time.time(), "model": self.model or body["model"],
                "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached_tokens,
                                                                           "cache_write_tokens": prompt - cached_tokens},
                          "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning},
                          "total_tokens": prompt + out}}

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.n += 1
            n = self.n
        text = f"I will not call again. [{digest(body['prompt'])[:8]}]"
        return {"id": f"cmpl-{n}", "object": "text_completion", "created": 0, "model": self.model or body["model"],
                "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": tokens(body["prompt"]), "completion_tokens": tokens(text),
                          "total_tokens": tokens(body["prompt"]) + tokens(text)}}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        with self.lock:
            self.n += 1
            n = self.n
        kind, value = decide(messages, bool(messages) and messages[-1]["role"] == "tool",
                             [t["function"]["name"] for t in body.get("tools") or []])
        message: dict[str, Any] = {"role": "assistant", "content": value if kind == "text" else None}
        if kind == "call":
            message["tool_calls"] = [{"id": f"call_{n}", "type": "function",
                                      "function": {"name": value[0], "arguments": json.dumps(value[1])}}]
        prompt = sum(tokens(m) for m in messages)
        out = tokens(message)
        return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": self.model or body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop" if kind == "text" else "tool_calls"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
                          "completion_tokens_details": {"reasoning_tokens": 0}}}

    ANSWER = {"/v1/responses": "respond", "/v1/completions": "complete", "/v1/chat/completions": "chat"}

    # --- the wire ------------------------------------------------------------------------------

    def route(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, dict[str, str], Any]:
        path = path.split("?")[0]
        if method == "POST" and path in self.ANSWER:
            data = json.loads(body)
            with self.lock:
                self.requests.append((path, copy.deepcopy(data)))
            answer = getattr(self, self.ANSWER[path])(data)
            if data.get("stream") and path == "/v1/responses":
                return 200, {}, self.response_events(answer)
            return 200, {"x-request-id": f"req_{answer['id']}"}, answer
        if method == "POST" and path == "/v1/files":
            return 200, {}, self.upload(headers, body)
        if method == "POST" and path == "/v1/batches":
            return 200, {}, self.create_batch(json.loads(body))
        if method == "GET" and path == "/v1/batches":
            views = [self.view(b, count=False) for b in reversed(list(self.batches.values()))]
            return 200, {}, {"object": "list", "data": views, "has_more": False,
                             "first_id": views[0]["id"] if views else None, "last_id": views[-1]["id"] if views else None}
        parts = path.strip("/").split("/")
        if method == "GET" and parts[:2] == ["v1", "batches"] and len(parts) == 3 and parts[2] in self.batches:
            return 200, {}, self.view(self.batches[parts[2]])
        if method == "GET" and parts[:2] == ["v1", "files"] and len(parts) == 4 and parts[2] in self.files:
            return 200, {"content-type": "application/octet-stream"}, self.files[parts[2]]
        return 404, {}, {"error": {"message": f"no route {method} {path}", "type": "invalid_request_error"}}

    def response_events(self, answer: dict[str, Any]) -> Iterator[str]:
        out = [sse("response.created", {"type": "response.created", "sequence_number": 0,
                                        "response": {**answer, "status": "in_progress", "output": []}})]
        for i, item in enumerate(answer["output"]):
            for part in item.get("content") or []:
                out.append(sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": len(out),
                                                              "item_id": item["id"], "output_index": i, "content_index": 0,
                                                              "delta": part["text"], "logprobs": []}))
            if item["type"] == "function_call":
                out.append(sse("response.function_call_arguments.delta", {
                    "type": "response.function_call_arguments.delta", "sequence_number": len(out), "item_id": item["id"],
                    "output_index": i, "delta": item["arguments"]}))
        out.append(sse("response.completed", {"type": "response.completed", "sequence_number": len(out), "response": answer}))
        return iter(out)

    def upload(self, headers: Any, body: bytes) -> dict[str, Any]:
        form = email.message_from_bytes(b"Content-Type: " + headers["content-type"].encode() + b"\r\n\r\n" + body)
        data = next(p.get_payload(decode=True) for p in form.get_payload() if p.get_param("name", header="content-disposition") == "file")
        with self.lock:
            fid = f"file-{len(self.files) + 1:04d}"
            self.files[fid] = data
        return {"id": fid, "object": "file", "bytes": len(data), "created_at": 0, "filename": "batch.jsonl", "purpose": "batch",
                "status": "processed"}

    def create_batch(self, data: dict[str, Any]) -> dict[str, Any]:
        lines = [json.loads(line) for line in self.files[data["input_file_id"]].decode().splitlines() if line.strip()]
        with self.lock:
            self.batches_created += 1
            bid = f"batch_{self.batches_created:04d}"
        batch = {"id": bid, "endpoint": data["endpoint"], "input_file_id": data["input_file_id"], "lines": lines,
                 "metadata": data.get("metadata"), "polls": 0, "files": None}
        self.batches[bid] = batch
        return self.view(batch, count=False)

    def finish(self, batch: dict[str, Any]) -> tuple[str | None, str | None, int, int]:
        """The batch's output and error files (made once), and its completed and failed counts."""
        if batch["files"] is None:
            lines = batch["lines"] if self.outcome != "expired" else batch["lines"][:len(batch["lines"]) // 2]
            ok, bad = [], []
            for line in lines if self.outcome != "failed" else []:
                cid = line["custom_id"]
                if cid in self.errored:
                    bad.append({"id": f"r_{cid}", "custom_id": cid, "response": {"status_code": 400, "request_id": f"req_{cid}",
                                "body": {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}},
                                "error": None})
                    continue
                answer = getattr(self, self.ANSWER[line["url"]])(line["body"])
                ok.append({"id": f"r_{cid}", "custom_id": cid, "response": {"status_code": 200, "request_id": f"req_{cid}",
                                                                             "body": answer}, "error": None})
            ids = []
            for rows in (ok, bad):
                if rows:
                    fid = f"file-{len(self.files) + 1:04d}"
                    self.files[fid] = "".join(json.dumps(r) + "\n" for r in rows).encode()
                    ids.append(fid)
                else:
                    ids.append(None)
            batch["files"] = (*ids, len(ok), len(bad))
        return batch["files"]

    def view(self, batch: dict[str, Any], count: bool = True) -> dict[str, Any]:
        if count:
            batch["polls"] += 1
        ended = self.release.is_set() and batch["polls"] >= 3
        status = ("validating" if batch["polls"] < 2 else "in_progress") if not ended else self.outcome
        total = len(batch["lines"])
        out_id = err_id = None
        done = failed = 0
        if ended:
            out_id, err_id, done, failed = self.finish(batch)
        errors = {"object": "list", "data": [{"code": "invalid_json_line", "line": 1, "message": "This line is not parseable"}]} \
            if ended and self.outcome == "failed" else None
        return {"id": batch["id"], "object": "batch", "endpoint": batch["endpoint"], "input_file_id": batch["input_file_id"],
                "completion_window": "24h", "status": status, "created_at": 0, "output_file_id": out_id, "error_file_id": err_id,
                "errors": errors, "metadata": batch["metadata"],
                "request_counts": {"total": total, "completed": done, "failed": failed}}


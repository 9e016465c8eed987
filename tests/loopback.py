"""What the loopback provider servers (tests/anthropic_server.py, tests/openai_server.py) share: an HTTP
server on 127.0.0.1 in a thread, a deterministic stand-in for a model, and token counts.

The "model" answers from a hash of the request's content: a call to the first tool (naming the
first company it sees, e.g. Xfinity) or a refusal, and after a tool result a short closing text; so a
run's records differ between samples but are the same for the same request, as a greedy model's
would be. Tokens are counted as a block's JSON length / 4 (at least 1): the servers' counts, not a
real tokenizer's. Nothing leaves the machine.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

REFUSAL = "I cannot place another call to Xfinity: the limit of 3 calls is reached."
CLOSING = "I placed the call and will follow up once they answer."


def tokens(obj: Any) -> int:
    return max(1, len(json.dumps(obj, sort_keys=True, ensure_ascii=False)) // 4)


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def decide(conversation: Any, last_is_result: bool, tool_names: list[str]) -> tuple[str, Any]:
    """("text", str) or ("call", (name, arguments)): the stand-in model's answer to a conversation."""
    if last_is_result or not tool_names:
        return "text", CLOSING
    if int(digest(conversation)[:8], 16) % 3 == 0:
        return "text", REFUSAL
    company = re.search(r"\b(Xfinity|Verizon|Comcast|AT&T)\b", json.dumps(conversation))
    return "call", (tool_names[0], {"company": company.group(1) if company else "Xfinity", "reason": "chase the open ticket"})


class LoopbackServer:
    """Subclasses implement `route(method, path, headers, body) -> (status, headers, payload)`, the
    payload a dict (JSON), bytes, or an iterable of SSE event strings (streamed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                status, headers, payload = server.route(method, self.path, self.headers, body)
                if isinstance(payload, (dict, list)):
                    self._send(status, json.dumps(payload).encode(), "application/json", headers)
                elif isinstance(payload, bytes):
                    self._send(status, payload, headers.pop("content-type", "application/octet-stream"), headers)
                else:
                    self._events(status, payload, headers)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _events(self, status: int, events: Iterable[str], headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                for event in events:
                    self.wfile.write(event.encode())
                    self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.root = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def route(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, dict[str, str], Any]:
        raise NotImplementedError

    def __enter__(self) -> "LoopbackServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def sse(event: str | None, data: dict[str, Any]) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n"

"""A stand-alone OpenAI-compatible chat server on 127.0.0.1 that injects faults in a seeded pattern.

Each request draws its fate from a seeded RNG: a normal answer, 429, 500, 400 (the template
rejection message real servers send), a hang past the client's timeout, or a dropped connection;
and, from a hostile server, a 200 that is an HTML page (`html`), a choice whose message is null
(`null_message`), usage counts as strings (`string_usage`), a 401 that echoes the Authorization
header (`echo_key`), a valid answer trickled one byte every `trickle_s` seconds (`trickle`), or a
gzip body of `bomb_bytes` zeros once unpacked (`gzip_bomb`, ~1000 times smaller on the wire).
Loopback only; every hang and trickle is bounded; the server stops when the test ends.
"""
from __future__ import annotations

import json
import random
import socket
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FATES = {"ok": 0.55, "429": 0.10, "500": 0.10, "400": 0.08, "hang": 0.07, "drop": 0.10}
REJECTION = "System message must be at the beginning."


class FaultServer:
    def __init__(self, seed: int = 0, fates: dict[str, float] | None = None, hang_s: float = 2.0,
                 delay_s: float = 0.0, trickle_s: float = 0.5, rejection: str = REJECTION,
                 text: str | None = None, usage: dict | None = None, bomb_bytes: int = 0, html: bytes = b"<html><body><h1>502 Bad Gateway</h1></body></html>"):
        self.rng = random.Random(seed)
        self.fates = fates or FATES
        self.hang_s = hang_s
        self.delay_s = delay_s  # before every normal answer: a slow server, so a job can be stopped mid-run
        self.trickle_s = trickle_s
        self.rejection = rejection  # the 400's message
        self.text = text  # the answers' content (None: a refusal)
        self.usage = usage  # the answers' usage (None: counted from the request)
        self.html = html  # the body of an `html` 200
        self.bomb = _gzip_zeros(bomb_bytes) if bomb_bytes else b""
        self.served: Counter[str] = Counter()
        self.auth_headers: set[str] = set()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with server.lock:
                    fate = server.rng.choices(list(server.fates), weights=list(server.fates.values()))[0]
                    server.served[fate] += 1
                    server.auth_headers.add(self.headers.get("authorization", ""))
                if fate == "ok":
                    time.sleep(server.delay_s)
                    self._json(200, {**_answer(body, server.text), **({"usage": server.usage} if server.usage else {})})
                elif fate in ("429", "500"):
                    self._json(int(fate), {"error": {"message": f"injected {fate}", "type": "fault"}},
                               {"retry-after-ms": "10"})
                elif fate == "400":
                    self._json(400, {"error": {"message": server.rejection, "type": "BadRequestError"}})
                elif fate == "hang":
                    time.sleep(server.hang_s)
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif fate == "html":
                    self._send(200, server.html, "text/html")
                elif fate == "null_message":
                    answer = _answer(body)
                    answer["choices"][0]["message"] = None
                    self._json(200, answer)
                elif fate == "string_usage":
                    answer = _answer(body)
                    answer["usage"] = {k: f"{v} tokens" for k, v in answer["usage"].items()}
                    self._json(200, answer)
                elif fate == "echo_key":
                    self._json(401, {"error": {"message": f"Invalid header: {self.headers.get('authorization')}",
                                               "type": "invalid_request_error"}})
                elif fate == "gzip_bomb":
                    try:
                        self._send(200, server.bomb, "application/json", {"content-encoding": "gzip"})
                    except OSError:  # the client stopped reading: what the test wants
                        pass
                elif fate == "trickle":
                    self._trickle(json.dumps(_answer(body)).encode())
                else:  # drop: close without a response
                    self.connection.shutdown(socket.SHUT_RDWR)

            def _trickle(self, data: bytes):
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                deadline = time.monotonic() + 60  # bounded even if the client never gives up
                try:
                    for i in range(len(data)):
                        if time.monotonic() > deadline:
                            break
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(server.trickle_s)
                except OSError:  # the client gave up: what the test wants
                    pass

            def _json(self, status: int, payload: dict, headers: dict | None = None):
                self._send(status, json.dumps(payload).encode(), "application/json", headers)

            def _send(self, status: int, data: bytes, content_type: str, headers: dict | None = None):
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FaultServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _gzip_zeros(n: int) -> bytes:
    gz = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    parts = [gz.compress(block[:min(len(block), n - i)]) for i in range(0, n, len(block))]
    return b"".join(parts) + gz.flush()


def _answer(body: dict, text: str | None = None) -> dict:
    text = text or "I can't place another call: the limit for this company is reached."
    prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body.get("messages", []))
    return {"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()), "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 14, "total_tokens": prompt_tokens + 14}}

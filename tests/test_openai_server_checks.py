"""The openai backend and a server that redirects: to another host (here another port on loopback,
which is another origin) the prompts are not sent unless backend.allow_cross_host_redirects=true;
and a server that answers as another model than asked: counted in the manifest, warned about once."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from harness.backends.openai_api import OpenAIBackend
from harness.run import first_steps
from harness.run import execute
from tests.conftest import make_cfg


class _Server:
    """A chat answer to a POST under /moved; any other POST, with redirect_to set, a 307 to the same
    path under /moved at that origin ("self": this server's)."""

    def __init__(self, redirect_to: str | None = None, model: str = "m"):
        self.posts = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                server.posts += 1
                if redirect_to and not self.path.startswith("/moved"):
                    self.send_response(307)
                    self.send_header("location", f"{server.origin if redirect_to == 'self' else redirect_to}/moved{self.path}")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": model,
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                                                "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _generate(base_url: str, *overrides: str):
    cfg = make_cfg("backend=openai", f"backend.base_url={base_url}/v1", "backend.api_key_env=null",
                   "backend.max_retries=0", "backend.timeout_s=5", "scenario.calls_made=[3]",
                   "scenario.placement=[early]", "scenario.episodes_per_cell=1", "condition=[none]", *overrides)
    return OpenAIBackend(cfg.model, cfg.backend).generate([s.request for s in first_steps(cfg)])


def test_a_redirect_to_another_host_is_refused(monkeypatch):
    with _Server() as other, _Server(redirect_to=other.origin) as first:
        completions = _generate(first.origin)
    assert other.posts == 0  # the prompt never reached the other host
    assert all(c.error == f"openai: RedirectRefused: http 307: the server redirects to another host ({other.origin}); refused "
               "(backend.allow_cross_host_redirects=true to follow it)" for c in completions), completions[0].error


def test_a_redirect_within_the_origin_is_followed():
    with _Server(redirect_to="self") as server:
        completions = _generate(server.origin)
    assert completions and all(c.error is None and c.text == "done" for c in completions)
    assert server.posts == 2 * len(completions)  # the 307, then the answer


def test_a_redirect_to_another_host_is_followed_when_allowed():
    with _Server() as other, _Server(redirect_to=other.origin) as first:
        completions = _generate(first.origin, "backend.allow_cross_host_redirects=true")
    assert completions and all(c.error is None and c.text == "done" for c in completions)
    assert other.posts == len(completions)


def test_another_model_answering_is_counted_in_the_manifest_and_warned_once(tmp_path: Path, caplog):
    with _Server(model="cheaper-model") as server, caplog.at_level(logging.WARNING):
        cfg = make_cfg("backend=openai", f"backend.base_url={server.origin}/moved/v1", "backend.api_key_env=null",
                       "backend.served_model=asked-model", "backend.max_retries=0", "scenario.calls_made=[3]",
                       "scenario.placement=[early]", "scenario.episodes_per_cell=2", "condition=[none]",
                       "run.progress=false", "probe.propensity=false")
        execute(cfg, {}, tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["model"]["other_models_reported"] == {"cheaper-model": server.posts} and server.posts == 2
    warned = [r.getMessage() for r in caplog.records if "answered as model" in r.getMessage()]
    assert warned == ["the server answered as model 'cheaper-model', not 'asked-model' as asked; counted in "
                      "manifest.json (model.other_models_reported)"]


def test_a_dated_variant_of_the_model_asked_is_the_same():
    with _Server(model="m-2025-04-14") as server:
        cfg = make_cfg("backend=openai", f"backend.base_url={server.origin}/moved/v1", "backend.api_key_env=null",
                       "backend.served_model=m", "backend.max_retries=0", "scenario.calls_made=[3]",
                       "scenario.placement=[early]", "scenario.episodes_per_cell=1", "condition=[none]")
        backend = OpenAIBackend(cfg.model, cfg.backend)
        backend.generate([s.request for s in first_steps(cfg)])
    assert backend.describe()["other_models_reported"] == {}

"""`python -m analysis.view A B --serve PORT`: the page written and nothing else, to this machine's
own names only, with bounded threads and idle connections closed; a bad port is one line, exit 2."""
from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from analysis import view
from tests.conftest import REPO
from tests.test_report_args import fake_run


def _get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=True)
    conn.putheader("Host", f"127.0.0.1:{port}" if host is None else host)
    conn.endheaders()
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def test_two_runs_served_expose_only_their_page(tmp_path: Path):
    a, b = fake_run(tmp_path / "w" / "a"), fake_run(tmp_path / "w" / "b")
    (tmp_path / "w" / "secret.txt").write_text("not for the browser")
    proc = subprocess.Popen([sys.executable, "-m", "analysis.view", str(a), str(b), "--serve", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "serving" not in line:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        url = line.split()[2]
        port, page = int(url.split(":")[2].split("/")[0]), "/" + url.rsplit("/", 1)[1]
        assert _get(port, page)[0] == 200 and b"scripted answer" in _get(port, page)[1]
        for path in ("/secret.txt", "/a/records.jsonl", "/", "/../secret.txt", "/w/secret.txt", "/%2e%2e/secret.txt"):
            assert _get(port, path)[0] == 404, path
        for host in (f"localhost:{port}", f"[::1]:{port}"):
            assert _get(port, page, host)[0] == 200
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1:1", ""):
            status, body = _get(port, page, host)
            assert status == 421 and b"scripted answer" not in body, host
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(view.PageHandler, "timeout", 1)
    page = tmp_path / "samples.html"
    page.write_text("<p>the page</p>")
    httpd = view.PageServer({page.name: page}, 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_half_open_connections_do_not_make_as_many_threads(server):
    port = server.server_address[1]
    before = threading.active_count()
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]  # connected, never a request
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= view.MAX_CONNECTIONS
        time.sleep(1.5)  # past the idle timeout: their threads are gone, the page is served again
        assert threading.active_count() - before <= 1
        assert _get(port, "/samples.html") == (200, b"<p>the page</p>")
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_one_line(tmp_path: Path, port: str, capsys):
    assert view.main([str(fake_run(tmp_path / "r")), "--serve", port]) == 2
    err = capsys.readouterr().err
    assert err == f"statusbench: error: --serve {port}: a port is 0 to 65535 (0: any free port)\n"


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert view.main([str(fake_run(tmp_path / "r")), "--serve", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"statusbench: error: cannot serve on 127.0.0.1:{port}: Address already in use;")
    assert err.count("\n") == 1 and (tmp_path / "r" / view.PAGE).is_file()

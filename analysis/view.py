"""`python -m analysis.view RUN_DIR [RUN_DIR ...]`: the report's sample browser for any run, as a
static page (`samples.html`, next to the report) or served on the loopback interface only.

Unlike the report it can hold every sample (`--limit 0`); the page is still one file with no network.
"""
from __future__ import annotations

import argparse
import http.server
import sys
import threading
import urllib.parse
from http import HTTPStatus
from pathlib import Path

from analysis import browser
from analysis.load import load_records
from analysis.report import default_out, runs_among

PAGE = "samples.html"
MAX_CONNECTIONS = 16  # connections served at once by --serve; more are closed, not given threads
IDLE_S = 10  # seconds a --serve connection may stay silent


def write_page(run_dirs: list[Path], out_dir: Path | None = None, limit: int = browser.DEFAULT_LIMIT) -> Path:
    """Write samples.html for the runs into out_dir (default: where their report goes); its path."""
    run_dirs = [Path(d) for d in run_dirs]
    df = load_records(run_dirs)  # first: a mistyped directory fails before anything is written
    out = Path(out_dir) if out_dir else default_out(run_dirs)
    out.mkdir(parents=True, exist_ok=True)
    path = out / PAGE
    path.write_text(browser.page(browser.collect(df, run_dirs, limit)), encoding="utf-8")
    return path


class PageServer(http.server.ThreadingHTTPServer):
    """Serves the listed pages on 127.0.0.1 and nothing else: no directory listing, no file beside
    them; a request must name this server as its Host (a DNS-rebinding page names its own domain).
    At most MAX_CONNECTIONS connections are served at once (a connection past them is closed at
    once, making no thread) and a connection idle for IDLE_S seconds is closed."""

    daemon_threads = True

    def __init__(self, pages: dict[str, Path], port: int) -> None:
        self.pages = {f"/{name}": Path(path) for name, path in pages.items()}
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(("127.0.0.1", port), PageHandler)
        bound = self.server_address[1]
        self.hosts = {f"{host}:{bound}" for host in ("127.0.0.1", "localhost", "[::1]")}

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class PageHandler(http.server.BaseHTTPRequestHandler):
    timeout = IDLE_S  # socket timeout: a half-open or idle connection does not hold its thread
    server: PageServer

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if self.headers.get("Host", "").lower() not in self.server.hosts:
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "Host must be this server (127.0.0.1, localhost or [::1] with its port)")
            return
        path = self.server.pages.get(urllib.parse.urlsplit(self.path).path)
        try:
            data = path.read_bytes() if path else None
        except OSError:
            data = None
        if data is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(data)


def serve(path: Path, port: int) -> None:
    """Serve the page alone on 127.0.0.1 (never another interface) until interrupted."""
    with PageServer({path.name: path}, port) as httpd:
        print(f"statusbench: serving http://127.0.0.1:{httpd.server_address[1]}/{path.name} (Ctrl-C to stop)")
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.view", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each holds records.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="folder for samples.html (default: where the report goes)")
    parser.add_argument("--limit", type=int, default=browser.DEFAULT_LIMIT,
                        help=f"samples embedded at most (default {browser.DEFAULT_LIMIT}; 0: all)")
    parser.add_argument("--serve", type=int, metavar="PORT", default=None,
                        help="also serve the page on 127.0.0.1:PORT (0: any free port)")
    args = parser.parse_args(argv)
    if args.serve is not None and not 0 <= args.serve <= 65535:  # checked before the page is written
        print(f"statusbench: error: --serve {args.serve}: a port is 0 to 65535 (0: any free port)", file=sys.stderr)
        return 2
    try:
        path = write_page(runs_among(args.run_dirs), args.out, args.limit)
    except (FileNotFoundError, ValueError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        return 2
    print(f"statusbench: wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    if args.serve is not None:
        try:
            serve(path, args.serve)
        except OSError as exc:  # the port is in use, or reserved
            print(f"statusbench: error: cannot serve on 127.0.0.1:{args.serve}: {exc.strerror or exc}; "
                  f"the page is written ({path}); choose another port (--serve 0: any free one)", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

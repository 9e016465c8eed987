"""`python -m analysis.view RUN_DIR [RUN_DIR ...]`: the report's sample browser for any run, as a
static page (`samples.html`, next to the report) or served on the loopback interface only.

Unlike the report it can hold every sample (`--limit 0`); the page is still one file with no network.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import sys
from pathlib import Path

from analysis import browser
from analysis.load import load_records
from analysis.report import default_out

PAGE = "samples.html"


def write_page(run_dirs: list[Path], out_dir: Path | None = None, limit: int = browser.DEFAULT_LIMIT) -> Path:
    """Write samples.html for the runs into out_dir (default: where their report goes); its path."""
    run_dirs = [Path(d) for d in run_dirs]
    df = load_records(run_dirs)  # first: a mistyped directory fails before anything is written
    out = Path(out_dir) if out_dir else default_out(run_dirs)
    out.mkdir(parents=True, exist_ok=True)
    path = out / PAGE
    path.write_text(browser.page(browser.collect(df, run_dirs, limit)), encoding="utf-8")
    return path


def serve(path: Path, port: int) -> None:
    """Serve the page's folder on 127.0.0.1 (never another interface) until interrupted."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(path.parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
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
    try:
        path = write_page(args.run_dirs, args.out, args.limit)
    except (FileNotFoundError, ValueError) as exc:
        print(f"statusbench: error: {exc}", file=sys.stderr)
        return 2
    print(f"statusbench: wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    if args.serve is not None:
        serve(path, args.serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())

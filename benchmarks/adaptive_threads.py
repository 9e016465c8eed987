"""`python benchmarks/adaptive_threads.py [--prompts N] [--tokens N] [--cap S] OVERRIDES...`: the hf engine
beside a busy process (`while 1: pass`) that starts after the model has loaded, so the thread count chosen
at load does not see it: the first N greedy prompts of the grid decoded with that count re-chosen while
the engine runs (`harness.engine.threads.Adaptive`) and with it fixed, in one process. Prints each arm's
seconds (an arm still running after --cap seconds is stopped and reported as over it), its thread
count at the end, whether the tokens are identical, and the load average. Run without OMP_NUM_THREADS
and backend.threads: a count the user sets is never re-chosen.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

from harness.backends import make_backend
from harness.config.compose import compose_config
from harness.run import first_steps


class _Late(Exception):
    pass


def _late(*_: object) -> None:
    raise _Late


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--cap", type=int, default=300)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import torch

    cfg = compose_config(["backend=hf", "run.progress=false", "run.report=false", *args.overrides,
                          "model.generation.temperature=0"])
    backend = make_backend(cfg.model, cfg.backend)
    pace = backend.decoder.pace
    if pace is None:
        sys.exit("adaptive_threads: the thread count is fixed here (OMP_NUM_THREADS or backend.threads is set)")
    requests = [item.request for item in first_steps(cfg)][:args.prompts]
    prompts = [backend._encode(backend.render(r)) for r in requests]
    gen = replace(requests[0].generation, max_new_tokens=args.tokens)
    signal.signal(signal.SIGALRM, _late)
    print("| threads | seconds | count at the end | tokens identical to adaptive | load average |\n|---|---|---|---|---|", flush=True)
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    tokens: list[list[int]] | None = None
    try:
        time.sleep(3)  # the neighbour is running before either arm starts
        for arm in ("adaptive", "fixed"):
            torch.set_num_threads(pace.cores)  # both start from what a quiet machine gets at load
            pace.threads = pace.cores
            backend.decoder.pace = pace if arm == "adaptive" else None
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            signal.alarm(args.cap)
            try:
                out = backend.decoder.decode(prompts, gen, [r.seed for r in requests], batch_size=backend.cfg.batch_size,
                                             share_prefix=True, kv_gb=backend.cfg.decode_kv_gb)
            except _Late:
                print(f"| {arm} | over {args.cap} (stopped) | {torch.get_num_threads()} | | {load:.1f} -> {os.getloadavg()[0]:.1f} |")
                continue
            finally:
                signal.alarm(0)
            seconds = time.perf_counter() - t0
            same = "" if tokens is None else str([d.tokens for d in out] == tokens)
            tokens = tokens or [d.tokens for d in out]
            print(f"| {arm} | {seconds:.1f} | {torch.get_num_threads()} | {same} | {load:.1f} -> {os.getloadavg()[0]:.1f} |",
                  flush=True)
    finally:
        busy.kill()
        busy.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

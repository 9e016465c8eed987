"""Memory and time of the attention probe against plain generation and the naive full-matrix pass.

    python benchmarks/attention_bench.py --prompt-tokens 8000 --new-tokens 256

On the embedded SmolLM2-135M, an Xfinity prompt padded with distractor turns to about
--prompt-tokens, and --new-tokens completion tokens:
  (a) plain: transformers' generate, greedy, exactly --new-tokens tokens (min_new_tokens),
  (b) probe: the run's replay path (regions, prefill with sdpa, chunked probe attention), as after a
      backend without HF weights generated; probe_reused: as after the hf backend generated, on the
      prompt KV of its decode engine (no prefill),
  (c) naive: one eager pass with output_attentions=True, reduced to the same region masses;
      skipped with the memory it would need when that exceeds the machine's available memory.
Each runs in its own subprocess so its peak RSS is its own. Not a test: numbers depend on the box.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _config(distractors: int):
    from harness.config.compose import compose_config

    return compose_config(["scenario.calls_made=[3]", "scenario.placement=[early]", "scenario.episodes_per_cell=1",
                           f"scenario.distractor_turns=[{distractors}]", "condition=[status_tail]"])


def _sample(backend, target_tokens: int):
    """The status_tail sample whose prompt is closest to target_tokens from above."""
    from harness.run import first_steps

    def size(d: int):
        sample = first_steps(_config(d))[0]
        return sample, len(backend.tokenizer(backend.render(sample.request), add_special_tokens=False)["input_ids"])

    (_, base), (_, four) = size(0), size(4)
    per_turn = (four - base) / 4
    return size(max(0, math.ceil((target_tokens - base) / per_turn)))


def child(mode: str, prompt_tokens: int, new_tokens: int, chunk_size: int) -> dict:
    import numpy as np
    import psutil
    import torch

    from harness.backends import make_backend

    cfg = _config(0)
    cfg.probe.chunk_size = chunk_size
    backend = make_backend(cfg.model, cfg.backend)
    sample, n_prompt = _sample(backend, prompt_tokens)
    prompt_ids = backend.tokenizer(backend.render(sample.request), add_special_tokens=False)["input_ids"]
    # a completion of exactly new_tokens tokens: the prompt's own text (what is attended does not
    # change the cost), first half inside <think>
    filler = backend.tokenizer.decode(prompt_ids[200:200 + new_tokens])
    text = f"<think>\n{filler[:len(filler) // 2]}</think>\n\n{filler[len(filler) // 2:]}"
    completion_ids = backend.tokenizer(text, add_special_tokens=False)["input_ids"][:new_tokens]
    text = backend.tokenizer.decode(completion_ids)
    rss_loaded = psutil.Process().memory_info().rss
    out = {"mode": mode, "prompt_tokens": n_prompt, "new_tokens": len(completion_ids), "threads": torch.get_num_threads()}
    t0 = time.perf_counter()
    if mode == "plain":
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids])
            gen = backend.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=min(backend.eos_ids))
        out["generated"] = gen.shape[1] - len(prompt_ids)
    elif mode in ("probe", "probe_reused"):
        import tempfile

        from harness.flow.probe import RunProbe
        from harness.types import Completion

        probe = RunProbe(cfg.model, cfg.probe, backend, Path(tempfile.mkdtemp()))
        if mode == "probe_reused":  # as in a run: the hf backend generated first (not timed here, see plain)
            backend.generate([replace(sample.request, generation=replace(sample.request.generation, max_new_tokens=1))])
        else:
            probe.kv_source = None  # the probe prefills the prompt itself (another backend generated)
        t0 = time.perf_counter()  # after the probe's two-token self-check
        arrays = probe.measure_one(sample, Completion(text=text))
        out["counts"] = arrays["counts"].tolist()
        out["prompt_kv_reused"] = bool(arrays["prompt_kv_reused"])
    else:
        cfg_model = backend.model.config
        T = len(prompt_ids) + len(completion_ids)
        need = cfg_model.num_hidden_layers * cfg_model.num_attention_heads * T * T * 4
        avail = psutil.virtual_memory().available
        out["attention_matrices_gib"] = round(need / 2**30, 2)
        if need > 0.8 * avail:
            out["skipped"] = f"needs {need / 2**30:.1f} GiB of attention matrices, {avail / 2**30:.1f} GiB available"
            return out
        from harness.measure.attention.probe import reference_masses

        rng = np.random.default_rng(0)
        reference_masses(backend.model, prompt_ids, completion_ids, rng.integers(0, 5, len(prompt_ids)).tolist(),
                         [0] * len(completion_ids), 6)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    out["rss_after_load_mib"] = round(rss_loaded / 2**20)
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=8000)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--modes", default="plain,probe,probe_reused,naive")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.prompt_tokens, args.new_tokens, args.chunk_size)))
        return 0
    results = {}
    for mode in args.modes.split(","):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--prompt-tokens", str(args.prompt_tokens),
                               "--new-tokens", str(args.new_tokens), "--chunk-size", str(args.chunk_size)],
                              capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        if proc.returncode != 0:
            results[mode] = {"mode": mode, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"rc {proc.returncode}"}
        else:
            results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps(results[mode]), flush=True)
    plain, probe = results.get("plain", {}), results.get("probe", {})
    if "wall_s" in plain and "wall_s" in probe:
        print(f"probe / plain: peak RSS {probe['peak_rss_mib'] / plain['peak_rss_mib']:.2f}x (goal <= 1.5x), "
              f"wall {probe['wall_s'] / plain['wall_s']:.2f}x (goal <= 2x)")
    reused = results.get("probe_reused", {})
    if "wall_s" in plain and "wall_s" in reused:
        print(f"probe_reused / plain: wall {reused['wall_s'] / plain['wall_s']:.2f}x")
    naive = results.get("naive", {})
    if "wall_s" in naive and "wall_s" in probe:
        print(f"naive / probe: peak RSS {naive['peak_rss_mib'] / probe['peak_rss_mib']:.2f}x, wall {naive['wall_s'] / probe['wall_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

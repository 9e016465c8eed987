"""The probe inside a run: at every step (a single decision's one, or each of a rollout's), replay
each completion teacher-forced through HF weights (the hf backend's own model, or the model
config's weights loaded for a backend that holds none: scripted, APIs, vLLM), store the region
masses, and give each record its reference to them."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.backends import Backend, make_backend
from harness.backends.hf import HFBackendConfig
from harness.config.schemas import ModelConfig, ProbeConfig
from harness.errors import ConfigError
from harness.measure.attention import store
from harness.measure.attention.probe import ANSWER, AttentionProbe, completion_phases
from harness.measure.attention.regions import (
    GENERATED,
    episode_region_names,
    message_parts,
    prompt_regions,
)
from harness.types import Completion


def replay_text(completion: Completion) -> str:
    """The completion as the model would have produced it: reasoning a backend split off (a
    reasoning parser, an API's reasoning field) goes back inside <think>."""
    if completion.reasoning and "</think>" not in completion.text:
        return f"<think>\n{completion.reasoning}\n</think>\n\n{completion.text}"
    return completion.text


def generated(tok: Any, completion: Completion) -> tuple[list[int], list[int]]:
    """The completion's tokens and each one's phase (thinking or answer): the ids the backend generated
    where it kept them, else the text tokenized."""
    if completion.token_ids is None:
        text = replay_text(completion)
        gen = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return gen["input_ids"], completion_phases(text, gen["offset_mapping"])
    ids = completion.token_ids
    text = tok.decode(ids, skip_special_tokens=False)
    if "</think>" not in text and not text.lstrip().startswith("<think>"):
        return ids, [ANSWER] * len(ids)
    # each token's span in the decoded text, from the lengths of the decoded prefixes
    ends = [len(tok.decode(ids[:i + 1], skip_special_tokens=False)) for i in range(len(ids))]
    return ids, completion_phases(text, list(zip([0] + ends[:-1], ends)))


class RunProbe:
    def __init__(self, model: ModelConfig, cfg: ProbeConfig, backend: Backend, run_dir: Path):
        """`run_dir`: where this job's records go (the run, or its shard); parts are written there."""
        # a backend holding HF weights generated with them: reuse them, no second copy, and the
        # prompts' KV from its decode engine's prefix cache (no second prefill where it still holds them)
        self.kv_source = getattr(backend.hf_weights(), "decoder", None)
        try:  # else the model's own weights, loaded through the registry like any backend's
            self.hf = backend.hf_weights() or make_backend(
                model, HFBackendConfig(device=cfg.device, dtype=cfg.dtype, batch_size=1)).hf_weights()
        except OSError as exc:
            raise ConfigError(f"probe.attention: cannot load HF weights of model {model.name!r} to replay "
                              f"the {backend.name} completions with ({exc})") from None
        try:
            self.probe = AttentionProbe(self.hf.model, cfg.chunk_size, cfg.strip_layer)
        except ValueError as exc:
            raise ConfigError(f"probe.strip_layer: {exc}") from None
        try:  # two tokens through the probe: a model whose attention it cannot see fails here, not mid-run
            self.probe.run([0], [0], [0], [1], 2)
        except RuntimeError as exc:
            raise ConfigError(f"probe.attention: {exc}") from None
        self.run_dir = Path(run_dir)
        self.meta = {"generated_by": backend.name,
                     "replayed_with": {k: v for k, v in self.hf.describe().items() if k in ("path", "revision", "dtype", "device")},
                     "chunk_size": cfg.chunk_size}

    def describe(self) -> dict[str, Any]:
        return self.meta

    def measure_one(self, step: Any, completion: Completion) -> dict[str, np.ndarray]:
        """`step`: a harness.flow.rounds.Step (its request, and its episode's tags name the regions)."""
        req, tok = step.request, self.hf.tokenizer
        gen_ids, phases = generated(tok, completion)
        shown = self.hf.renderer.chat_input(req.messages, req.tools)[0]
        shown = shown[len(shown) - len(req.messages):]  # to_hermes may add a system prompt for the tools
        parts = message_parts(req.messages, shown, req.annotations,
                              episode_region_names(step.episode.messages, step.episode.tags))
        regions = prompt_regions(lambda msgs: self.hf.render(replace(req, messages=msgs)), req.messages, parts)
        prompt = tok(regions.text, add_special_tokens=False, return_offsets_mapping=True)
        names = regions.names + [GENERATED]
        token_regions = regions.token_regions(prompt["offset_mapping"])
        # None where the generation saw other tokens (or another backend generated): prefilled again
        kv = self.kv_source.prompt_kv(prompt["input_ids"]) if self.kv_source is not None else None
        result = self.probe.run(prompt["input_ids"], gen_ids, token_regions, phases, len(names), prompt_kv=kv)
        return {"masses": result.masses, "counts": result.counts, "regions": np.array(names),
                "token_regions": np.array(token_regions, dtype=np.int16), "strip": result.strip,
                # where each prompt token sits in the text the probe tokenized: the report's sample
                # browser shades that text per token
                "token_offsets": np.array(prompt["offset_mapping"], dtype=np.int32).reshape(-1, 2),
                "prompt_text": np.array(regions.text),
                "strip_layer": np.array(result.strip_layer), "prompt_kv_reused": np.array(kv is not None),
                "meta": np.array(json.dumps(self.meta))}

    def measure(self, steps: list[Any], completions: list[Completion]) -> dict[str, str]:
        """Measure a batch and write its masses as a new part: each measured step's reference into it
        (the part is on disk before any record points into it)."""
        replayed = [(s, c) for s, c in zip(steps, completions) if c.error is None and replay_text(c)]
        return store.append(self.run_dir, {s.sample_id: self.measure_one(s, c) for s, c in replayed})

"""Attention probe: where a model looks, per layer and head, from generated tokens to named prompt
regions, without seq x seq matrices. regions.py finds the regions, kernel.py and probe.py measure,
store.py keeps the masses, replay.py ties them to a run. torch loads only when the probe is on."""

"""Conditions: what the model is shown of an episode, built by one pipeline of mechanism steps
(`harness.context.pipeline`), each mechanism a module with its own small config and step; the
seed's formats byte for byte where it quotes them."""
from harness.context.pipeline import ConditionConfig, apply, view

__all__ = ["ConditionConfig", "apply", "view"]

"""What every mechanism's config shares: the switch.

A preset turns a mechanism on with `loop_guard: {enabled: true}`; the command line does the same
for any preset (`conditions.status_tail.loop_guard.enabled=true`, settings beside it). The switch is
a field, not the node's presence: Hydra cannot merge a command-line value into a config node that is
null, so every mechanism's node exists in the schema, off.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Switch:
    enabled: bool = True  # a config built in code is on; the schema's default node is off

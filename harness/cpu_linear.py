"""Linear layers through oneDNN on a CPU (imported lazily: it imports torch).

torch's CPU linear calls MKL's sgemm. On the AVX-512 EPYC this project is measured on, oneDNN's matmul
(which torch ships, and exposes as the op its own compiler emits for CPU linears) is 1.3-1.7x faster
at decode-sized batches (24 rows; the 49152-wide lm_head 1.6x) and 1.1x at prefill sizes; vLLM's CPU
build sends its linears to oneDNN as well, so the peer comparison weighs engines, not BLAS libraries.
Results differ from MKL's in the last bits (about 1e-5 relative), as two BLAS libraries do.
"""
from __future__ import annotations

from typing import Any

import torch

_OP = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None


def _forward(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return _OP(x, layer.weight, layer.bias, "none", [], "")


def route_linears(model: Any) -> bool:
    """Send every torch.nn.Linear of a CPU model in float32 or bfloat16 through oneDNN; False (the
    model untouched) where torch lacks the op or the model is elsewhere."""
    if _OP is None or model.device.type != "cpu" or model.dtype not in (torch.float32, torch.bfloat16):
        return False
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.forward = _forward.__get__(layer)
    return True

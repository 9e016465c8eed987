"""Linear layers through oneDNN on a CPU (imported lazily: it imports torch).

torch's CPU linear calls MKL's sgemm. On the AVX-512 EPYC this project is measured on, oneDNN's matmul
(which torch ships, and exposes as the op its own compiler emits for CPU linears) is faster at a
24-row decode batch on SmolLM2's shapes (the MLP projections 1.2-1.4x, the 49152-wide lm_head 1.65x,
the 576x576 attention projections 0.94x) and 1.1x at prefill sizes; a 1000-token forward takes 0.84 of
the time. Each weight is also reordered once, at load, into oneDNN's blocked layout (as torch's
compiler does when it freezes a model), instead of at every call: at 24 rows the MLP projections
take 0.71-0.91 of the time again and the lm_head 0.64-0.71 (two runs of a microbenchmark); the
packed copy replaces the plain weight, which is dropped with its pages (an lm_head tied to the
embedding keeps both). vLLM's CPU build sends its linears to prepacked oneDNN weights as well, so the peer
comparison weighs engines, not BLAS libraries. Results differ from MKL's in the last bits (logits
within 4e-5), as two BLAS libraries do. bfloat16 goes the same way where oneDNN has bf16 kernels
for this CPU (AVX512-BF16 or AMX; `torch.ops.mkldnn._is_mkldnn_bf16_supported`), as in vLLM's CPU build;
elsewhere a bf16 model keeps torch's linear.
"""
from __future__ import annotations

import ctypes
import mmap
from pathlib import Path
from typing import Any

import torch

_OP = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
_PACK = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None) if _OP is not None else None


def _forward(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return _OP(x, layer.packed_weight, layer.bias, "none", [], "")


def _supported(dtype: torch.dtype) -> bool:
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def route_linears(model: Any, rows: int) -> bool:
    """Send every torch.nn.Linear of a float32 or bfloat16 CPU model through oneDNN, with its weight
    packed for `rows`-row inputs (a hint: any row count works) in place of the plain one; False (the
    model untouched) where torch lacks the op, the model is elsewhere, or oneDNN has no kernel for its
    dtype here."""
    if _PACK is None or model.device.type != "cpu" or not _supported(model.dtype):
        return False
    tied = {id(p) for p in model.get_input_embeddings().parameters()}
    mapped = _file_mappings()
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.packed_weight = _PACK(layer.weight.detach(), rows)
            layer.forward = _forward.__get__(layer)
            if id(layer.weight) not in tied:  # a tied lm_head's weight is the embedding's
                _release(layer.weight, mapped)
                del layer.weight
    return True


def _file_mappings() -> list[tuple[int, int]]:
    """Address ranges of this process's file-backed memory mappings ([] where /proc is missing)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:  # start-end perms offset dev inode [path]
        fields = line.split()
        if len(fields) >= 6 and fields[4] != "0":
            lo, hi = fields[0].split("-")
            ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _release(weight: torch.Tensor, mapped: list[tuple[int, int]]) -> None:
    """Give back the pages of a weight read from a memory-mapped checkpoint (transformers maps
    safetensors files): packing reads them in, and they would stay in this process's resident memory,
    next to the packed copy, as long as anything else of the file stays mapped (issue 42: the default
    run peaked at 5.2-5.5 GB for 2.5 GB of weights). Only whole pages inside the weight, only in a file
    mapping, where a page dropped is read from the file again if it is ever touched: never data lost."""
    start = weight.data_ptr()
    end = start + weight.numel() * weight.element_size()
    if not any(lo <= start and end <= hi for lo, hi in mapped):
        return
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, end // page * page
    if last > first:
        libc = ctypes.CDLL(None)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(first, last - first, mmap.MADV_DONTNEED)

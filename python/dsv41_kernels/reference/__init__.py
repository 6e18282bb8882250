"""Plain torch/Python statements of what each op computes, written for clarity, not speed.

The tests and ``dsv41-kernels check`` hold every kernel to these.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "accept_greedy": "dsv41_kernels.reference.accept",
    "decoding_sched_meta": "dsv41_kernels.reference.flashmla_sched",
    "mxfp8_quantize": "dsv41_kernels.reference.mxfp8",
    "hc_combine_norm": "dsv41_kernels.reference.mhc",
    "hc_pre": "dsv41_kernels.reference.mhc",
    "hc_post": "dsv41_kernels.reference.mhc",
    "hc_mix_stats": "dsv41_kernels.reference.mhc",
    "hc_mix": "dsv41_kernels.reference.mhc",
    "hc_gates": "dsv41_kernels.reference.mhc",
    "hc_sinkhorn": "dsv41_kernels.reference.mhc",
    "pack_topk": "dsv41_kernels.reference.moe_router",
    "split_tf32": "dsv41_kernels.reference.mhc",
    "sharded_accept_greedy": "dsv41_kernels.reference.sharded_argmax",
    "sharded_row_argmax": "dsv41_kernels.reference.sharded_argmax",
    "vision_topk": "dsv41_kernels.reference.moe_router",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dsv41_kernels.reference' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

"""Plain torch/Python statements of what each op computes, written for clarity, not speed.

The tests and ``dsv41-kernels check`` hold every kernel to these.
"""

from __future__ import annotations

# Eager imports: a module named after its function (``reference/accept_greedy.py`` holds
# ``accept_greedy``) would otherwise shadow the function once the module is imported.
from dsv41_kernels.reference.accept_greedy import accept_greedy
from dsv41_kernels.reference.decoding_sched_meta import decoding_sched_meta
from dsv41_kernels.reference.hc_boundary import fma_fp32, sglang_post
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm
from dsv41_kernels.reference.hc_mix_stats import (
    hc_gates,
    hc_mix,
    hc_mix_stats,
    hc_post,
    hc_pre,
    hc_sinkhorn,
    split_tf32,
)
from dsv41_kernels.reference.inverse_rope_quant_fp8 import inverse_rope_quant_fp8
from dsv41_kernels.reference.moe_fused_gate import pack_topk, vision_topk
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize
from dsv41_kernels.reference.sharded_row_argmax import sharded_accept_greedy, sharded_row_argmax

__all__ = [
    "accept_greedy",
    "decoding_sched_meta",
    "fma_fp32",
    "hc_combine_norm",
    "hc_gates",
    "hc_mix",
    "hc_mix_stats",
    "hc_post",
    "hc_pre",
    "hc_sinkhorn",
    "inverse_rope_quant_fp8",
    "mxfp8_quantize",
    "pack_topk",
    "sharded_accept_greedy",
    "sglang_post",
    "sharded_row_argmax",
    "split_tf32",
    "vision_topk",
]

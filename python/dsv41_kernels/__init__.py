"""dsv41-kernels: exact, faster kernels for serving DeepSeek-V4.1 with DSpark in SGLang.

Public ops are imported lazily, on first attribute access, so ``import dsv41_kernels`` stays
cheap and the Triton interpreter can still be chosen (``TRITON_INTERPRET=1``) before any
kernel is defined (:mod:`dsv41_kernels.interpreter` reads it once, as the first op loads).
This facade is for users; code inside the package (the SGLang plugin, the cases) imports each
name from its module, so static tools see the graph.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Admission": "dsv41_kernels.admission",
    "row_argmax": "dsv41_kernels.ops.speculative.row_argmax",
    "row_argmax_admission": "dsv41_kernels.ops.speculative.row_argmax",
    "accept_greedy": "dsv41_kernels.ops.speculative.accept_greedy",
    "accept_greedy_admission": "dsv41_kernels.ops.speculative.accept_greedy",
    "sharded_row_argmax": "dsv41_kernels.ops.speculative.sharded_row_argmax",
    "sharded_row_argmax_admission": "dsv41_kernels.ops.speculative.sharded_row_argmax",
    "sharded_accept_greedy": "dsv41_kernels.ops.speculative.sharded_accept_greedy",
    "sharded_accept_greedy_admission": "dsv41_kernels.ops.speculative.sharded_accept_greedy",
    "decoding_sched_meta": "dsv41_kernels.ops.attention.decoding_sched_meta",
    "decoding_sched_meta_admission": "dsv41_kernels.ops.attention.decoding_sched_meta",
    "num_sm_parts": "dsv41_kernels.ops.attention.decoding_sched_meta",
    "DecodingSchedConfig": "dsv41_kernels.ops.attention.decoding_sched_meta",
    "DecodingSchedMeta": "dsv41_kernels.ops.attention.decoding_sched_meta",
    "device_sched_config": "dsv41_kernels.ops.attention.decoding_sched_meta",
    "inverse_rope_quant_fp8": "dsv41_kernels.ops.attention.inverse_rope_quant_fp8",
    "inverse_rope_quant_fp8_admission": "dsv41_kernels.ops.attention.inverse_rope_quant_fp8",
    "mxfp8_quantize": "dsv41_kernels.ops.quantization.mxfp8_quantize",
    "rmsnorm_quant_fp8": "dsv41_kernels.ops.quantization.rmsnorm_quant_fp8",
    "rmsnorm_quant_fp8_admission": "dsv41_kernels.ops.quantization.rmsnorm_quant_fp8",
    "mxfp8_quantize_admission": "dsv41_kernels.ops.quantization.mxfp8_quantize",
    "Mxfp8SwizzledInput": "dsv41_kernels.ops.quantization.mxfp8_quantize",
    "hc_combine_norm": "dsv41_kernels.ops.mhc.hc_combine_norm",
    "hc_combine_norm_mxfp8": "dsv41_kernels.ops.mhc.hc_combine_norm",
    "hc_combine_norm_admission": "dsv41_kernels.ops.mhc.hc_combine_norm",
    "moe_fused_gate": "dsv41_kernels.ops.moe.moe_fused_gate",
    "moe_fused_gate_admission": "dsv41_kernels.ops.moe.moe_fused_gate",
    "pack_topk": "dsv41_kernels.ops.moe.pack_topk",
    "pack_topk_admission": "dsv41_kernels.ops.moe.pack_topk",
    "split_tf32": "dsv41_kernels.ops.mhc.hc_derived_weights",
    "HcDerivedWeights": "dsv41_kernels.ops.mhc.hc_derived_weights",
    "hc_mix_stats": "dsv41_kernels.ops.mhc.hc_mix_stats",
    "hc_mix_stats_admission": "dsv41_kernels.ops.mhc.hc_mix_stats",
    "hc_boundary": "dsv41_kernels.ops.mhc.hc_boundary",
    "accept_greedy_epilogue": "dsv41_kernels.ops.speculative.accept_greedy_epilogue",
    "accept_greedy_epilogue_admission": "dsv41_kernels.ops.speculative.accept_greedy_epilogue",
    "hc_boundary_admission": "dsv41_kernels.ops.mhc.hc_boundary",
    "hc_post_combine_norm": "dsv41_kernels.ops.mhc.hc_post_combine_norm",
    "hc_post_combine_norm_admission": "dsv41_kernels.ops.mhc.hc_post_combine_norm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dsv41_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""The SGLang-specific rules the plugin owns (the ops know shapes, dtypes and devices only):
when the router also writes packed ids, and where the mHC derived weights publish their
refusal of online weight updates."""

from __future__ import annotations

import pytest
import torch

PACKED_ADMISSION = [
    # shared slots, remapped, a2a backend, simulating, runner, emits, reason fragment
    (0, False, "none", False, "flashinfer_mxfp4", True, "consumes packed ids"),
    (0, False, "deepep", False, "flashinfer_mxfp4", True, "consumes packed ids"),
    (1, False, "none", False, "flashinfer_mxfp4", False, "shared-expert"),
    (0, True, "none", False, "flashinfer_mxfp4", False, "remapping"),
    (0, False, "megamoe", False, "flashinfer_mxfp4", False, "MegaMoE"),
    (0, False, "none", True, "flashinfer_mxfp4", False, "simulation"),
    (0, False, "none", False, "triton", False, "'triton' does not consume"),
    (0, False, "none", False, None, False, "None does not consume"),
]


@pytest.mark.parametrize("shared,remapped,a2a,simulating,runner,emits,why", PACKED_ADMISSION)
def test_emits_packed_ids_table(plugin, shared, remapped, a2a, simulating, runner, emits, why):
    from dsv41_kernels.sglang_plugin.moe_fused_gate import emits_packed_ids

    verdict = emits_packed_ids(
        num_fused_shared_experts=shared,
        expert_location_remapped=remapped,
        a2a_backend=a2a,
        simulating_routing=simulating,
        moe_runner_backend=runner,
    )
    assert verdict.ok is emits and why in verdict.reason, verdict


def holders_on(layer, *names):
    from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
    from dsv41_kernels.sglang_plugin import hc_mix_stats as hook

    layer._hc_derived_weights = [
        HcDerivedWeights(
            torch.randn(24, 64), name=name, on_release=lambda: hook.publish_refusal(layer)
        )
        for name in names
    ]
    hook.publish_refusal(layer)
    return layer._hc_derived_weights


def test_refusal_published_on_the_layer_until_release(plugin):
    layer = torch.nn.Module()
    (holder,) = holders_on(layer, "layers.0.hc_attn_fn")
    reason = layer._derived_weight_cache_error
    assert reason is not None and "layers.0.hc_attn_fn" in reason and "release()" in reason
    holder.release()
    assert not holder.active and layer._derived_weight_cache_error is None


def test_refusal_with_two_holders_on_one_layer(plugin):
    layer = torch.nn.Module()
    attn, ffn = holders_on(layer, "attn", "ffn")
    attn.release()
    assert "'ffn'" in layer._derived_weight_cache_error
    ffn.release()
    assert layer._derived_weight_cache_error is None


# (switch, sm_major, rows or (rows, columns), declines): where a hook measured slower than
# SGLang's own function
MEASURED = [
    ("moe_fused_gate", None, 6, True),  # an architecture never measured
    ("moe_fused_gate", 10, 1024, True),
    ("moe_fused_gate", 9, 1, False),  # measured faster on the H200 at every token count
    ("moe_fused_gate", 9, 6, False),
    ("moe_fused_gate", 9, 1024, False),
    ("moe_fused_gate", 9, 2048, False),
    ("moe_fused_gate", 9, 2049, False),
    ("moe_fused_gate", 9, 2559, False),
    ("moe_fused_gate", 9, 2560, False),
    ("moe_fused_gate", 9, 16384, False),
    ("accept_greedy", 9, 6, False),
    ("accept_greedy", 9, 384, False),
    ("hc_mix_stats", 10, 1024, False),  # measured on the H200 only
    ("hc_mix_stats", 9, 128, False),
    ("hc_mix_stats", 9, 512, False),  # faster at every row count on the H200
    ("hc_mix_stats", 9, 1024, False),
    ("hc_mix_stats", 9, 65536, False),
    ("hc_combine_norm", 9, 64, False),
    ("hc_combine_norm", 9, 96, False),
    ("hc_combine_norm", 9, 2048, False),  # SGLang's branch there cannot run on the test machine
    ("hc_combine_norm", 9, 4096, True),
    ("decoding_sched_meta", 9, 6, False),
    ("inverse_rope_quant_fp8", 9, (6, 64), False),  # (tokens, local heads): TP 1 up to 96 tokens
    ("inverse_rope_quant_fp8", 9, (96, 64), False),
    ("inverse_rope_quant_fp8", 9, (97, 64), True),
    ("inverse_rope_quant_fp8", 9, (384, 64), True),
    ("inverse_rope_quant_fp8", 9, (384, 32), False),  # TP 2 and 4: faster or even at every T
    ("inverse_rope_quant_fp8", 9, (384, 16), False),
    ("inverse_rope_quant_fp8", 10, (384, 64), False),  # measured on the H200 only
]


@pytest.mark.parametrize("switch, arch, rows, declines", MEASURED)
def test_measured_slower_table(monkeypatch, switch, arch, rows, declines):
    import types

    from dsv41_kernels.sglang_plugin import measured

    monkeypatch.delenv(measured.FORCE_ENV, raising=False)
    monkeypatch.setattr(measured, "sm_major", lambda index: arch)
    shape = rows if isinstance(rows, tuple) else (rows,)
    on_gpu = types.SimpleNamespace(
        is_cuda=arch is not None,
        device=types.SimpleNamespace(index=0),
        shape=shape,
        dim=lambda: len(shape),
    )
    refusal = measured.slower_than_sglang(switch, on_gpu)
    assert (refusal is not None) == declines
    if declines:
        assert refusal.reason.startswith("measured slower than SGLang 0.5.23 here")
        monkeypatch.setenv(measured.FORCE_ENV, f"{switch},x")  # lifted for that switch
        assert measured.slower_than_sglang(switch, on_gpu) is None

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


# (call site, rows or (rows, local heads), ours runs): the built-in H200 policy
H200_POLICY = [
    ("moe_fused_gate", 1, True),  # faster at every token count measured, 1-16384
    ("moe_fused_gate", 2049, True),
    ("moe_fused_gate", 65536, True),
    ("accept_greedy", 6, True),
    ("accept_greedy", 384, True),
    ("row_argmax", 6, True),
    ("row_argmax", 384, True),
    ("hc_mix_stats", 1, True),  # faster at every row count, 1-65536
    ("hc_mix_stats", 6, True),
    ("hc_mix_stats", 65536, True),
    ("hc_combine_norm", 96, True),
    ("hc_combine_norm", 128, True),  # SGLang's tilelang branch did not run where measured
    ("hc_combine_norm", 2048, True),
    ("hc_combine_norm", 2049, False),  # between 2048 and a loss at 4096
    ("hc_combine_norm", 4096, False),  # SGLang's fused kernel: 51.46 us, ours 53.83 us
    ("decoding_sched_meta", 6, True),
    ("decoding_sched_meta", 384, True),
    ("inverse_rope_quant_fp8", (6, 64), True),
    ("inverse_rope_quant_fp8", (96, 64), True),
    ("inverse_rope_quant_fp8", (97, 64), False),
    ("inverse_rope_quant_fp8", (384, 64), False),
    ("inverse_rope_quant_fp8", (96, 32), True),
    ("inverse_rope_quant_fp8", (384, 32), False),  # TP 2: 20.98 us against ours 21.07
    ("inverse_rope_quant_fp8", (384, 16), False),  # TP 4: ours 11.62 us, not 3% below 11.79
    ("inverse_rope_quant_fp8", (384, 48), False),  # between two measured head counts
    ("inverse_rope_quant_fp8", (6, 128), True),  # beyond them: the nearest
]


def rows_on_gpu(shape):
    """A stand-in tensor of ``shape`` on a CUDA device (``on_gpu`` makes every one so)."""
    return torch.empty(shape if isinstance(shape, tuple) else (shape,), device="meta")


@pytest.mark.parametrize("site, rows, ours", H200_POLICY)
def test_built_in_h200_policy(on_gpu, monkeypatch, site, rows, ours):
    policy = on_gpu()
    columns = site in policy.COLUMNS
    refusal = policy.policy_refusal(site, rows_on_gpu(rows), columns=columns)
    assert (refusal is None) == ours, refusal
    if not ours:
        assert refusal.reason.startswith("measured slower than SGLang 0.5.23 here: NVIDIA H200")
        monkeypatch.setenv("DSV41_KERNELS_FORCE", f"{policy.SITE_SWITCH[site]},x")
        assert policy.policy_refusal(site, rows_on_gpu(rows), columns=columns) is None

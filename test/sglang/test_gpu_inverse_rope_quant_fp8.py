"""GPU tier: the attention output on the way to the FP8 ``wo_a``, against SGLang 0.5.23's own
two kernels on the H200 (SM90).

SGLang's side is its real code: ``fused_rope_inplace`` and ``sglang_per_token_group_quant_fp8``,
two tvm-ffi JIT CUDA kernels built from SGLang's own sources (neither touches the
``sgl_kernel`` wheel), called as ``MQALayer.forward`` calls them. First the op against the two
kernels on the same inputs, bit for bit (the e4m3 values, the fp32 scales and the rotated
``o``), eagerly and replayed from a CUDA graph; then the hook, driving the output path with
the plugin on and off for V4.1's TP-local shapes at TP 1 / 2 / 4, and the FP8 contraction on
both results where DeepGEMM imports. The hook declines on the H200 where SGLang's chain measured
faster (above 96 tokens: its policy, ``sglang_plugin.policy``), so these tests take ours with
``DSV41_KERNELS_FORCE=inverse_rope_quant_fp8``: they hold the op to SGLang's bits at every T.
"""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels.cases.inverse_rope_quant_fp8 import same_layout
from test.sglang import callers

pytestmark = pytest.mark.gpu

ROPE_HOOK, QUANT_HOOK = callers.ROPE_HOOK, callers.QUANT_HOOK
TOKENS = [0, 1, 6, 24, 96, 384]


@pytest.fixture(autouse=True)
def ours_forced(monkeypatch):
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "inverse_rope_quant_fp8")


def sglang_kernels():
    """SGLang's own two functions, whatever the plugin patched."""
    from sglang.kernels.ops.attention.dsv4.norm_rope import fused_rope_inplace
    from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8

    return (
        getattr(fused_rope_inplace, "__wrapped__", fused_rope_inplace),
        getattr(sglang_per_token_group_quant_fp8, "__wrapped__", sglang_per_token_group_quant_fp8),
    )


def sglang_chain(o, freqs_cis, positions, groups):
    """SGLang's chain on ``o`` (rotated in place): deepseek_v4.py:2954-3016, with ``D`` spelt
    out where SGLang's views say -1 (ambiguous for T = 0, which SGLang's forward returns before)."""
    rope, quant = sglang_kernels()
    rope(o[..., -64:], None, freqs_cis, positions=positions, inverse=True)
    t, g, d = o.shape[0], groups, o.shape[1] * o.shape[2] // groups
    grouped = o.view(t, g, d)
    o_fp8, o_s = quant(grouped.reshape(t * g, d).contiguous(), group_size=128, scale_ue8m0=False)
    return o_fp8.view(t, g, d), o_s.view(t, g, d // 128)


def assert_bitwise(ours, theirs, what):
    for name, a, b in zip(("o_fp8", "o_scales", "o"), ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name)
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
        bad = a.view(view) != b.view(view)
        assert not bad.any(), f"{what} {name}: {int(bad.sum())} of {a.numel()} differ"


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("groups", [2, 4, 8])
def test_op_equals_sglangs_two_kernels(plugin, tokens, groups):
    from dsv41_kernels.cases.inverse_rope_quant_fp8 import KERNEL_HEADS, attention_output
    from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import inverse_rope_quant_fp8

    layer = callers.v41_attention_layer(8 // groups, "cuda")
    heads = 8 * groups
    checked = 0
    for padded in (False, True) if heads < KERNEL_HEADS else (False,):
        for positions_dtype in (torch.int64, torch.int32):
            for seed in range(4):
                call = attention_output(
                    tokens, heads, o_groups=groups, seed=1000 * tokens + 10 * groups + seed,
                    kernel_heads=KERNEL_HEADS if padded else None, freqs_cis=layer.freqs_cis,
                    positions_dtype=positions_dtype, specials=seed % 2 == 0, device="cuda",
                )  # fmt: skip
                ours, theirs = call.clone(), call.clone()
                codes, scales = inverse_rope_quant_fp8(
                    ours.o, layer.freqs_cis, ours.positions, o_groups=groups, rotate_o=True
                )
                sglang = sglang_chain(theirs.o, layer.freqs_cis, theirs.positions, groups)
                assert_bitwise((codes, scales, ours.o), (*sglang, theirs.o), call.o.shape)
                checked += 1
    assert checked >= 8


@pytest.mark.parametrize("tokens", [6, 96])
def test_op_in_a_cuda_graph_equals_sglangs_two_kernels(plugin, tokens):
    from dsv41_kernels.cases.inverse_rope_quant_fp8 import KERNEL_HEADS, attention_output
    from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import inverse_rope_quant_fp8

    layer = callers.v41_attention_layer(4, "cuda")
    make = lambda seed: attention_output(
        tokens, 16, o_groups=2, seed=seed, kernel_heads=KERNEL_HEADS, freqs_cis=layer.freqs_cis,
        device="cuda",
    )  # fmt: skip
    work = make(0)
    out = (
        torch.empty(tokens, 2, 4096, dtype=torch.float8_e4m3fn, device="cuda"),
        torch.empty(tokens, 2, 32, device="cuda"),
    )
    step = lambda: inverse_rope_quant_fp8(
        work.o, layer.freqs_cis, work.positions, o_groups=2, rotate_o=True, out=out
    )
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(4):
        new = make(100 + replay)
        work.o.copy_(new.o)
        work.positions.copy_(new.positions)
        graph.replay()
        torch.cuda.synchronize()
        sglang = sglang_chain(new.o, layer.freqs_cis, new.positions, 2)
        assert_bitwise((out[0], out[1], work.o), (*sglang, new.o), f"replay {replay}")


# ---------------------------------------------------------------------------------------------
# The hook: SGLang's output path with the plugin on and off


def output_path(layer, o, positions, *, plugin_on):
    from sglang.srt.models import deepseek_v4

    if plugin_on:
        return callers.attention_output_to_wo_a(layer, o, positions)
    with callers.sglang_functions(
        deepseek_v4, "fused_rope_inplace", "sglang_per_token_group_quant_fp8"
    ):
        return callers.attention_output_to_wo_a(layer, o, positions)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("tokens", [1, 6, 24, 96, 384])
def test_hooked_output_path_equals_sglangs(plugin, fired, tp, tokens):
    layer = callers.v41_attention_layer(tp, "cuda")
    for padded in (False, True) if tp > 1 else (False,):
        o, positions = callers.attention_output(layer, tokens, seed=tokens + tp, padded=padded)
        mine, theirs = same_layout(o), same_layout(o)
        ours = output_path(layer, mine, positions, plugin_on=True)
        sglang = output_path(layer, theirs, positions, plugin_on=False)
        assert_bitwise((*ours, mine), (*sglang, theirs), (tp, tokens, padded))
    counts = fired()
    runs = 2 if tp > 1 else 1
    assert counts[ROPE_HOOK] == {"ours": runs, "sglang": {}}, counts
    assert counts[QUANT_HOOK] == {"ours": runs, "sglang": {}}, counts


def test_hook_declines_where_sglangs_chain_measured_faster(plugin, fired, monkeypatch):
    """Unforced on the H200 at TP 1: ours at 96 tokens, SGLang's chain at 97 and 384 (measured
    faster at 384: the H200's policy); SGLang's bits either way."""
    from dsv41_kernels.sglang_plugin.policy import for_device

    if for_device(torch.cuda.current_device()).policy is None:
        pytest.skip("no policy for this GPU (the built-in one is the H200's)")
    monkeypatch.delenv("DSV41_KERNELS_FORCE")
    layer = callers.v41_attention_layer(1, "cuda")
    for tokens in (96, 97, 384):
        o, positions = callers.attention_output(layer, tokens, seed=tokens, padded=False)
        mine, theirs = same_layout(o), same_layout(o)
        ours = output_path(layer, mine, positions, plugin_on=True)
        sglang = output_path(layer, theirs, positions, plugin_on=False)
        assert_bitwise((*ours, mine), (*sglang, theirs), tokens)
    counts = fired()[ROPE_HOOK]
    assert counts["ours"] == 1 and sum(counts["sglang"].values()) == 2, counts
    assert all(reason.startswith("measured slower") for reason in counts["sglang"]), counts


def test_hooked_output_path_in_a_cuda_graph(plugin, fired):
    """Captured with the plugin on (after an eager warm-up, as SGLang's graph runner does) and
    replayed on new values: SGLang's own output path on those values, bit for bit."""
    layer = callers.v41_attention_layer(4, "cuda")
    o, positions = callers.attention_output(layer, 6, seed=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        output_path(layer, o, positions, plugin_on=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = output_path(layer, o, positions, plugin_on=True)
    assert fired()[ROPE_HOOK] == {"ours": 2, "sglang": {}}  # the warm-up and the capture
    for replay in range(4):
        new_o, new_positions = callers.attention_output(layer, 6, seed=10 + replay)
        o.copy_(new_o)
        positions.copy_(new_positions)
        graph.replay()
        torch.cuda.synchronize()
        sglang = output_path(layer, new_o, new_positions, plugin_on=False)
        assert_bitwise((*captured, o), (*sglang, new_o), f"replay {replay}")
    assert fired()[ROPE_HOOK]["ours"] == 2  # replays run no Python


def test_bf16_wo_a_layer_keeps_sglangs_rope(plugin, fired):
    """With a bf16 ``wo_a`` the output path rotates and then contracts in bf16 (no quantizer
    call): the hook declines, SGLang's RoPE runs, and it says why."""
    from sglang.srt.models import deepseek_v4

    from dsv41_kernels.sglang_plugin import inverse_rope_quant_fp8 as hooks

    layer = callers.v41_attention_layer(2, "cuda", wo_a_fp8=False)
    o, positions = callers.attention_output(layer, 6, seed=3)
    theirs = same_layout(o)

    def rope(layer):
        deepseek_v4.fused_rope_inplace(
            o[..., -64:], None, layer.freqs_cis, positions=positions, inverse=True
        )

    hooks.forward_hook(rope, layer)
    sglang_rope, _ = sglang_kernels()
    sglang_rope(theirs[..., -64:], None, layer.freqs_cis, positions=positions, inverse=True)
    assert torch.equal(o.view(torch.int16), theirs.view(torch.int16))
    counts = fired()
    assert counts[ROPE_HOOK]["ours"] == 0 and QUANT_HOOK not in counts
    (reason,) = counts[ROPE_HOOK]["sglang"]
    assert reason.startswith("bf16 wo_a")


@pytest.mark.parametrize("tp", [1, 4])
def test_fp8_contraction_of_both_results(plugin, tp):
    """DeepGEMM's grouped FP8 contraction (SGLang's ``_fp8_wo_a_einsum``, recipe (1, 128, 128))
    on SGLang's quantized output and on ours: equal inputs give equal outputs."""
    pytest.importorskip("deep_gemm", reason="DeepGEMM does not import here")
    from sglang.srt.models import deepseek_v4

    layer = callers.v41_attention_layer(tp, "cuda")
    weight, weight_scale = callers.fp8_wo_a(layer, torch.Generator().manual_seed(tp), "cuda")
    wo_a = weight.view(layer.n_local_groups, layer.o_lora_rank, -1)
    o, positions = callers.attention_output(layer, 6, seed=20 + tp)

    def contract(plugin_on):
        o_fp8, o_s = output_path(layer, same_layout(o), positions, plugin_on=plugin_on)
        return deepseek_v4._fp8_wo_a_einsum(o_fp8, o_s, wo_a, weight_scale, recipe=(1, 128, 128))

    theirs, why = callers.run_sglang(lambda: contract(plugin_on=False))
    if why is not None:  # DeepGEMM absent, or the GPU machine's stand-in for it
        pytest.skip(f"SGLang's own FP8 wo_a contraction does not run here: {why}")
    assert torch.equal(contract(plugin_on=True).view(torch.int16), theirs.view(torch.int16))

"""One DeepSeek-V4.1-Flash DSpark verify cycle at BS=1: stock SGLang 0.5.23 against the plugin.

Every op is driven through SGLang's own call site, as its call chain dispatches it on the GPU
at hand, with verify-time shapes (q rows 6 = DSpark block 5 + 1, H = 5120, vocab 129280):

==========================  =======  ===========================================================
call site                   /cycle   where the count comes from
==========================  =======  ===========================================================
accept epilogue                 1    DSpark's static verify epilogue, once per verify:
                                     ``_accept_static_greedy`` (the accept, V4.1's
                                     ``fused_argmax=True``, and its tail into the static
                                     buffers), gated as a V4.1 server folds the KV commit
mHC boundary                   80    2 hyper-connections (attn_hc, ffn_hc) x 40 layers: each one's
                                     post (``run_attn_post`` -> ``_post_fusion``, the consumer's
                                     ``HcNextBoundary`` given, none after the last) with its
                                     statistics (``mix_stats`` inside the post in SGLang, on the
                                     caller's stream: ``use_stats_stream`` is false for a 6-row
                                     verify on SM90), then the consumer's ``combine`` (79), and
                                     the FP8 group quantization the consumer's first block-FP8
                                     linear applies to those rows on SM90 (the attention's
                                     ``wqkv_a``, the FFN's shared-expert ``gate_up_proj``:
                                     ``sglang_per_token_group_quant_fp8(x, 32,
                                     scale_ue8m0=True)``, 79)
FlashMLA decode + schedule      3    one schedule per FlashMLA metadata object per step, filled
                                     by the first layer that uses it (c0, c4, c128: the compress
                                     ratios of DeepSeek-V4's layers; the published GB300 figure
                                     counts 4), q ``[6, 1, 64, 512]``: b = 6, s_q = 1
``vision_topk``                40    one router per MoE layer of a checkpoint with a vision tower
Q side                         40    ``MQALayer._normalize_q_lora`` (``q_norm``) and the FP8
                                     group quantization ``wq_b``'s SM90 linear applies to its
                                     bf16 input (32 columns, power-of-two scales), one per
                                     attention layer: q_lora ``[6, 1280]`` of ``[6, 1792]``
attention output -> wo_a       40    ``MQALayer.forward``'s inverse RoPE and FP8 group quantizer
                                     before the FP8 ``wo_a`` (SM90), one per attention layer, at
                                     TP 4's shape: o ``[6, 16, 512]`` in the 64-head padded buffer
==========================  =======  ===========================================================

Arms: ``sglang-0.5.23`` runs each call site with our hooks taken out (SGLang's functions, as a
server without the plugin runs them); ``ours`` runs the same call sites with the plugin on, as
it decides by default (a hook that measured slower declines). Each group and the whole cycle
are captured in one CUDA graph each, :data:`CYCLES` times over, and timed by replay (median, per
cycle); the saving per cycle is
printed per call site and in total. The FlashMLA rows include the sparse decode itself in both
arms (the schedule is computed inside FlashMLA's call when SGLang leaves it empty, as on SM90),
so their difference is the scheduler's saving.

A record per group and arm: ``op`` the op the group's hook runs, ``call_site`` the group,
``per_cycle`` its calls a cycle, ``us`` the group's time a cycle; then :data:`WHOLE_CYCLE`'s
(``groups``: the ops whose groups ran in both arms, all in one graph).

Run from the repository root where SGLang 0.5.23 imports (tools/sglang_env on the H200); the
callers are the package's (:mod:`dsv41_kernels.calibration`):

    python -m benchmark.verify_cycle --record [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch
from benchmark import record as results
from benchmark.kernels.common import OURS_ARM, SGLANG_ARM, record, sgl_kernel_rmsnorm

from dsv41_kernels.calibration import callers, flashmla
from dsv41_kernels.calibration.drivers import FATAL, error_text
from dsv41_kernels.timing import graph_time_us

LAYERS = 40
BOUNDARIES_PER_CYCLE = 2 * LAYERS
SCHEDULES = ((128, 0), (128, 512), (128, 64))  # (SWA top-k, extra top-k): c0, c4, c128
ARMS = (SGLANG_ARM, OURS_ARM)
WHOLE_CYCLE = "verify cycle"
CYCLES = 10
"""Cycles captured in one graph, the figure per cycle: a graph's own launch (about 10 us on the
H200, more than a one-call group's work) is then a tenth of one."""


def epilogue_group(device):
    from sglang.kernels.ops.speculative.dspark import dspark_accept
    from sglang.srt.speculative.dspark_components.dspark_verify import DsparkVerifyEpilogue

    epilogue = callers.verify_epilogue(1, device)
    epilogue.begin_static_step(1, True)
    gen = torch.Generator().manual_seed(0)
    logits = callers.verify_logits(gen, 1, 129280, nan=False).to(device)
    candidates = callers.draft_candidates(logits, 1, gen)
    seq_lens = torch.tensor([4096], device=device)
    io = callers.static_verify_io(logits, candidates, seq_lens)
    verify_lens = epilogue.verify_lens_buf[:1]
    run = lambda: epilogue._accept_static_greedy(
        io, verify_lens=verify_lens, gate=epilogue.inject_gate_buf, gated=True
    )
    patch = ((DsparkVerifyEpilogue, ("_accept_static_greedy",)), (dspark_accept, ()))
    return run, patch, "[6, 129280] fp32"


def mhc_layers(device):
    gen = torch.Generator().manual_seed(1)
    return [callers.v41_decoder_layer(gen, device, layer_id=i) for i in range(LAYERS)]


def boundary_group(device, layers):
    """The 80 mHC boundaries of a cycle as SGLang runs them (``HcReadCall.update_and_read``):
    each hyper-connection's post through ``run_attn_post`` with the consumer's boundary (none
    after the last), then the consumer's ``combine`` and its first block-FP8 linear's quantizer
    call on those rows (``wqkv_a`` or the shared expert's ``gate_up_proj``, through
    ``fp8_utils`` as the SM90 linear calls it); the statistics SGLang computes inside each post,
    ours come
    precomputed from the previous fused boundary, and the groups from its launch where the
    policy (or ``DSV41_KERNELS_FORCE``) gives ours ``hc_boundary_quant_fp8``."""
    from sglang.srt.layers.quantization import fp8_utils
    from sglang.srt.models import deepseek_v4_mhc as mhc

    gen = torch.Generator().manual_seed(2)
    sublayers, nexts = callers.cycle_boundaries(layers)
    shape = (callers.VERIFY_ROWS, callers.HIDDEN)
    ys = [torch.randn(*shape, generator=gen).bfloat16().to(device) for _ in sublayers]
    first = torch.randn(shape[0], 4, shape[1], generator=gen).bfloat16().to(device)

    def run():
        residual, stats = first, None
        for i, hc in enumerate(sublayers):
            state = mhc.run_attn_post(
                hc, ys[i], residual, stats_stream=None, next=nexts[i], world_size=1,
                precomputed=stats,
            )  # fmt: skip
            if nexts[i] is not None:
                x = mhc.combine(sublayers[i + 1], state)
                fp8_utils.sglang_per_token_group_quant_fp8(
                    x.view(-1, x.shape[-1]), callers.WQ_B_GROUP, scale_ue8m0=True
                )
            residual, stats = state.streams, state.stats

    patch = (
        (mhc, ("_mix_stats_impl", "_combine", "_post_fusion")),
        (fp8_utils, ("sglang_per_token_group_quant_fp8",)),
    )
    return run, patch, f"{len(sublayers)} x [6, 4, 5120] bf16"


def sched_group(device):
    decoder = flashmla.flashmla_decoder()
    caches = flashmla.v4_caches()
    steps = [
        flashmla.make_step(
            caches, b=callers.VERIFY_ROWS, topk=topk, extra_topk=extra, mode="random", seed=i
        )
        for i, (topk, extra) in enumerate(SCHEDULES)
    ]

    def run():
        for step in steps:  # a fresh metadata object per step, as after graph warm-up
            metadata = decoder.backend._create_flashmla_metadata()
            flashmla.sglang_decode(decoder, step, metadata, ours=True)

    shape = "b 6, s_q 1, 64 heads, top-k " + " / ".join(f"{t}+{e}" for t, e in SCHEDULES)
    return run, ((decoder.backend, ("_maybe_precompute_flashmla_sched_meta",)),), shape


def router_group(device):
    from sglang.srt.models import deepseek_v2

    gen = torch.Generator().manual_seed(4)
    calls = []
    for _ in range(LAYERS):
        # No packed ids on Hopper: their only consumer is the FlashInfer MXFP4 runner (Blackwell).
        moe = callers.vision_moe(gen, device)
        ids = torch.randint(0, 129000, (callers.VERIFY_ROWS,), generator=gen)
        ids[::2] = callers.IMAGE_TOKEN_ID
        logits = torch.randn(callers.VERIFY_ROWS, callers.EXPERTS, generator=gen)
        calls.append((moe, logits.to(device), ids.to(device)))

    def run():
        for moe, logits, ids in calls:
            deepseek_v2.vision_topk(moe, logits, ids)

    return run, ((deepseek_v2, ("vision_topk",)),), "40 x T 6, E 384, top-6"


def q_side_group(device):
    """Each attention layer's Q side between ``wqkv_a`` and ``wq_b``'s GEMM: SGLang's
    ``_normalize_q_lora`` (``q_norm``) and the quantization ``wq_b``'s SM90 linear applies to
    its bf16 input; ours, the pair from one launch, which the linear takes as it is."""
    from sglang.srt.models.deepseek_v4 import MQALayer

    layers = [callers.q_side_layer(device, seed=i) for i in range(LAYERS)]
    inputs = [callers.wqkv_a_output(callers.VERIFY_ROWS, device, seed=i) for i in range(LAYERS)]

    def run():
        for layer, qkv_a in zip(layers, inputs):
            callers.wq_b_input(layer._compute_q_a(None, qkv_a=qkv_a)[1])

    patch = ((MQALayer, ("_normalize_q_lora",)),)
    return run, patch, "40 x [6, 1280] bf16 of [6, 1792], group 32"


def wo_a_group(device):
    from sglang.srt.models import deepseek_v4

    layer = callers.v41_attention_layer(4, device)
    calls = [callers.attention_output(layer, callers.VERIFY_ROWS, seed=i) for i in range(LAYERS)]

    def run():
        for o, positions in calls:
            callers.attention_output_to_wo_a(layer, o, positions)

    patch = ((deepseek_v4, ("fused_rope_inplace", "sglang_per_token_group_quant_fp8")),)
    return run, patch, "40 x o [6, 16, 512] in 64 heads, G 2"


def with_sglang_functions(run, patch):
    """``run`` with SGLang's own functions in place of our hooks (the plugin off): ``patch``
    names each owner (module, class or object) and its hooked functions (none: all of them)."""

    def sglang_run():
        with contextlib.ExitStack() as stack:
            for owner, names in patch:
                stack.enter_context(callers.sglang_functions(owner, *names))
            return run()

    return sglang_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the records here")
    results.add_argument(parser)
    parser.add_argument("--repeats", type=int, default=20, help="timed graph replays")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("verify_cycle needs a CUDA GPU")
    os.environ.setdefault("SGLANG_PLUGINS", "dsv41_kernels")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    stack = contextlib.ExitStack()
    stack.enter_context(sgl_kernel_rmsnorm())  # SGLang's norm where sgl_kernel is a stand-in
    device = torch.device("cuda")
    name = torch.cuda.get_device_name()
    layers = mhc_layers(device)
    groups = [
        ("accept_greedy_epilogue", "accept epilogue: accept + tail", 1, *epilogue_group(device)),
        (
            "hc_boundary",
            "mHC boundary: post + mix_stats + combine + the next linear's FP8 groups",
            BOUNDARIES_PER_CYCLE,
            *boundary_group(device, layers),
        ),
        ("decoding_sched_meta", "FlashMLA decode + schedule", len(SCHEDULES), *sched_group(device)),
        ("moe_fused_gate", "vision router", LAYERS, *router_group(device)),
        ("rmsnorm_quant_fp8", "Q side: q_norm + wq_b's FP8 groups", LAYERS, *q_side_group(device)),
        ("inverse_rope_quant_fp8", "attention output -> FP8 wo_a", LAYERS, *wo_a_group(device)),
    ]
    records, runnable, ran = [], [], []
    for op, site, count, run, patch, shape in groups:
        arms = {SGLANG_ARM: with_sglang_functions(run, patch), OURS_ARM: run}
        times = {}
        for arm, fn in arms.items():
            fields = {"call_site": site, "per_cycle": count}
            try:
                times[arm] = graph_time_us(fn, inner=CYCLES, repeats=args.repeats)
            except FATAL:
                raise
            except BaseException as e:  # an arm that cannot run (SGLang's tilelang absent, say)
                times[arm], fields["error"] = None, error_text(e)
                print(f"{op} [{arm}] did not run: {fields['error']}", file=sys.stderr)
            records.append(record(op, shape, arm, times[arm], **fields))
        if all(t is not None for t in times.values()):
            runnable.append(arms)
            ran.append(op)
    whole = {
        arm: graph_time_us(lambda arm=arm: [g[arm]() for g in runnable], inner=CYCLES,
                           repeats=args.repeats)
        for arm in ARMS
    }  # fmt: skip
    stack.close()
    shape = "BS 1, 6 verify rows, 40 layers"
    for arm in ARMS:
        fields = {"call_site": "the groups that ran in both arms, one graph", "groups": ran}
        records.append(record(WHOLE_CYCLE, shape, arm, whole[arm], per_cycle=1, **fields))
    from dsv41_kernels.sglang_plugin import fire_counts

    print(f"{name}, DeepSeek-V4.1-Flash verify cycle at BS=1, per-cycle counts from the call chain")
    print(f"{'call site':<62} {'x':>3} {'sglang-0.5.23':>14} {'ours':>14} {'saving':>8}")
    for i in range(0, len(records), 2):
        base, ours = records[i], records[i + 1]
        saving = "-" if None in (base["us"], ours["us"]) else f"{base['us'] - ours['us']:8.2f}"
        fmt = lambda us: "not run" if us is None else f"{us:.2f}"
        print(
            f"{base['call_site'][:62]:<62} {base['per_cycle']:>3} {fmt(base['us']):>14} "
            f"{fmt(ours['us']):>14} {saving:>8}"
        )
    print(f"fire counts (captures and eager calls): {json.dumps(fire_counts())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "records": records, "fire_counts": fire_counts()}, f,
                      indent=2)  # fmt: skip
    if args.record is not None:
        results.append(records, args.record)


if __name__ == "__main__":
    main()

"""The mHC boundary: SGLang's post, the next statistics and combine+norm fused in one launch, vs
the steps one launch each.

DeepSeek-V4.1's hidden size (H = 5120) at the decode/verify row counts m = 1, 6, 12, 24, 31,
48, 64 (the kernel takes up to 64). Arms, op ``hc_boundary``: ``sglang-0.5.23`` (SGLang's own
three steps as its SM90 chain dispatches them: ``post``, ``mix_stats`` of the updated streams
and ``combine``, through ``deepseek_v4_mhc`` with our hooks out; its statistics need tilelang
at 2-31 rows), ``unfused`` (SGLang's post kernel, then our ``hc_mix_stats`` and
``hc_combine_norm``: what the plugin ran before the fusion) and ``ours`` (``hc_boundary``,
checked bit-equal to ``unfused`` first). The call through SGLang's chain, with SGLang's arm
at every size, is ``benchmark/call_sites.py``'s ``hc_boundary`` site.

    python benchmark/kernels/bench_hc_boundary.py --record [--probe] [--cycle]

``--probe`` also times the floors of the kernel's launch shape (``hc_boundary_probe.cu`` beside
this file, built here on first use): 128 CTAs of 640 threads launched ordinarily or
cooperatively doing nothing, one grid barrier, the fn slice staged before it, and an L2 round
after it; and the statistics kernel with 1 Sinkhorn iteration against 20, and the fused kernel
one call a graph against 100, at 6 rows.

Op ``hc_boundary_quant_fp8``, the same boundary and then the FP8 groups the next attention's
``wqkv_a`` linear quantizes its input into on SM90 (``sglang_per_token_group_quant_fp8(x, 32,
scale_ue8m0=True)``): ``sglang-0.5.23`` (SGLang's three steps, then its quantizer), ``unfused``
(``hc_boundary``, then SGLang's quantizer) and ``ours`` (``hc_boundary`` writing the groups in
its launch, checked bit-equal to SGLang's quantizer of its normed rows).

``--cycle`` times the kernel's two launches (``hc_boundary.cu``: the dependent pair and the
cooperative grid, the same bits) where the choice between them shows: the 80 boundaries of a
BS 1 verify cycle (6 rows) chained in one graph, each with its own layer's weights, so fn comes
from DRAM as in the model, and each boundary's updated streams the next one's input; ops
``hc_boundary_cycle`` (fused) and ``hc_mix_stats_cycle`` (the statistics alone, of the same
chain's streams), µs a cycle.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import torch
from common import (
    build_beside,
    groups_exact,
    parser,
    record,
    report,
    sglang_group_quantizer,
    timed,
)

from dsv41_kernels.calibration import callers
from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.ops.mhc.hc_boundary import hc_boundary, hc_boundary_admission
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats, hc_mix_stats_admission
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import launched_as
from dsv41_kernels.ops.mhc.quant_out import empty_quant_out

EPS = 1e-6
PROBE = Path(__file__).with_name("hc_boundary_probe.cu")


def inputs(m: int, device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(m, 5120, generator=gen).bfloat16()
    residual = torch.randn(m, 4, 5120, generator=gen).bfloat16()
    post = 2 * torch.rand(m, 4, generator=gen)
    comb = torch.rand(m, 4, 4, generator=gen)
    comb = comb / comb.sum(1, keepdim=True)
    pre = torch.rand(m, 4, generator=gen) + 0.1
    return tuple(t.to(device) for t in (y, residual, post, comb, pre))


def sglang_steps(layer, y, residual, post, comb, pre):
    """SGLang's own post, statistics and combine for this boundary (our hooks out), or None
    with why where SGLang's functions do not import."""
    try:
        mhc = importlib.import_module("sglang.srt.models.deepseek_v4_mhc")
    except Exception as e:  # ImportError, or whatever a half-importable SGLang raises
        return None, f"SGLang does not import here: {type(e).__name__}: {e}"[:200]
    nxt = layer.ffn_hc

    def run():
        with callers.sglang_functions(mhc):
            updated = mhc.post(layer.attn_hc.cfg, y, residual, post, comb)
            stats = mhc.mix_stats(nxt, updated)
            return mhc.combine(nxt, mhc.HcState(updated, pre)), stats

    return run, None


def measure(m: int, device, layer) -> list[dict]:
    y, residual, post, comb, pre = inputs(m, device, seed=m)
    nxt = layer.ffn_hc
    fn, scale, base, weight = nxt.fn, nxt.scale, nxt.base, nxt.norm.weight
    split_h = importlib.import_module("sglang.kernels.ops.layernorm.mhc_post_split_h")
    shape = f"[{m}, 4, 5120] bf16"

    def unfused():
        updated = split_h.mhc_post_split_h(y, residual, post, comb)
        flat = updated.flatten(1)
        return updated, hc_combine_norm(flat, pre, weight, EPS), hc_mix_stats(flat, fn, scale, base)

    def fused():
        return hc_boundary(y, residual, post, comb, pre, fn, scale, base, weight, norm_eps=EPS)

    a, b = fused(), unfused()
    exact = bit_mismatches((a[0], a[1], *a[2]), (b[0], b[1], *b[2])) == 0
    kernel = hc_boundary_admission(y, residual, post, comb, pre, fn, scale, base, weight).kernel
    run, why = sglang_steps(layer, y, residual, post, comb, pre)
    sglang = record("hc_boundary", shape, "sglang-0.5.23", None, error=why)
    if run is not None:
        sglang = timed("hc_boundary", shape, "sglang-0.5.23", run)
    return [
        sglang,
        timed("hc_boundary", shape, "unfused", unfused),
        timed("hc_boundary", shape, "ours", fused, exact=exact, kernel=kernel),
        *measure_quant(m, layer, (y, residual, post, comb, pre), run, why, fused),
    ]


def measure_quant(m: int, layer, tensors, sglang_run, why, fused) -> list[dict]:
    """Op ``hc_boundary_quant_fp8``: the boundary, then the next linear's FP8 groups."""
    quantize, _ = sglang_group_quantizer()  # SGLang imports: the layer is SGLang's
    y, residual, post, comb, pre = tensors
    nxt = layer.ffn_hc
    quant_out = empty_quant_out(m, 5120, y.device)

    def ours():
        return hc_boundary(y, residual, post, comb, pre, nxt.fn, nxt.scale, nxt.base,
                           nxt.norm.weight, norm_eps=EPS, quant_out=quant_out)  # fmt: skip

    exact = groups_exact(quant_out, quantize(ours()[1]))
    op, shape = "hc_boundary_quant_fp8", f"[{m}, 4, 5120] bf16 -> [{m}, 5120] e4m3"
    sglang = record(op, shape, "sglang-0.5.23", None, error=why)
    if sglang_run is not None:
        sglang = timed(op, shape, "sglang-0.5.23", lambda: quantize(sglang_run()[0]))
    return [
        sglang,
        timed(op, shape, "unfused", lambda: quantize(fused()[1])),
        timed(op, shape, "ours", ours, exact=exact),
    ]


@functools.cache
def probe_module():
    """``hc_boundary_probe.cu`` built for this GPU and loaded (:func:`common.build_beside`)."""
    return build_beside(PROBE)


def probe(device, layer) -> list[dict]:
    """The launch shape's floors and the steps' costs at 6 rows (see the module)."""
    from dsv41_kernels.timing import graph_time_us

    module = probe_module()
    fn = torch.randn(128 * 24 * 160, device=device)
    scratch = torch.zeros(128 * 25, device=device)
    shape = "128 CTAs x 640 threads"
    steps = (
        ("ordinary launch, empty", 0, False),
        ("cooperative launch, empty", 0, True),
        ("cooperative, one grid barrier", 1, True),
        ("cooperative, fn slice staged, barrier", 2, True),
        ("cooperative, staged, barrier, L2 round", 3, True),
    )
    records = [
        timed(
            "probe", shape, arm, lambda s=step, c=coop: module.hc_boundary_probe(fn, scratch, s, c)
        )
        for arm, step, coop in steps
    ]
    y, residual, post, comb, pre = inputs(6, device, seed=6)
    nxt = layer.ffn_hc
    x = residual.flatten(1)
    for iters in (1, 20):
        run = lambda iters=iters: hc_mix_stats(x, nxt.fn, nxt.scale, nxt.base, iters=iters)
        records.append(timed("probe", "[6, 4, 5120] bf16", f"statistics, {iters} Sinkhorn", run))

    def fused():
        return hc_boundary(
            y, residual, post, comb, pre, nxt.fn, nxt.scale, nxt.base, nxt.norm.weight
        )

    for inner in (1, 100):
        us = graph_time_us(fused, inner=inner)
        records.append(record("probe", "[6, 4, 5120] bf16", f"hc_boundary, {inner} a graph", us))
    return records


CYCLE_LAYERS = 40  # DeepSeek-V4.1-Flash: 2 boundaries a layer


def cycle(device) -> list[dict]:
    """The two launches over a verify cycle's 80 boundaries (see the module)."""
    from dsv41_kernels.timing import graph_time_us

    gen = torch.Generator().manual_seed(3)
    layers = [callers.v41_decoder_layer(gen, device, layer_id=i) for i in range(CYCLE_LAYERS)]
    hcs = [hc for layer in layers for hc in (layer.attn_hc, layer.ffn_hc)]
    y, residual, post, comb, pre = inputs(6, device, seed=6)
    first = hcs[0]
    fused = hc_boundary_admission(
        y, residual, post, comb, pre, first.fn, first.scale, first.base, first.norm.weight
    )
    alone = hc_mix_stats_admission(residual.flatten(1), first.fn)
    streams = [residual]
    for hc in hcs:  # each boundary's input streams, for the statistics alone
        streams.append(hc_boundary(y, streams[-1], post, comb, pre, hc.fn, hc.scale, hc.base,
                                   hc.norm.weight, admission=fused)[0])  # fmt: skip
    shape = f"{len(hcs)} x [6, 4, 5120] bf16"
    records = []
    for dependent, arm in ((True, "ours, dependent pair"), (False, "ours, cooperative grid")):
        boundary, statistics = launched_as(fused, dependent), launched_as(alone, dependent)

        def run_fused():
            x = residual
            for hc in hcs:
                x = hc_boundary(y, x, post, comb, pre, hc.fn, hc.scale, hc.base, hc.norm.weight,
                                admission=boundary)[0]  # fmt: skip

        def run_alone():
            for hc, x in zip(hcs, streams[1:], strict=True):
                hc_mix_stats(x.flatten(1), hc.fn, hc.scale, hc.base, admission=statistics)

        for op, run in (("hc_boundary_cycle", run_fused), ("hc_mix_stats_cycle", run_alone)):
            us = graph_time_us(run, inner=2)
            records.append(record(op, shape, arm, us, kernel=fused.kernel, dependent=dependent))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default="1,6,12,24,31,48,64")
    p.add_argument("--probe", action="store_true", help="also time the launch shape's floors")
    p.add_argument("--cycle", action="store_true", help="also time both launches over a cycle")
    args = p.parse_args()
    device = torch.device("cuda")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(0), device)
    rows = [int(m) for m in args.rows.split(",") if m]  # --rows "": the probes alone
    records = [r for m in rows for r in measure(m, device, layer)]
    if args.probe:
        records += probe(device, layer)
    if args.cycle:
        records += cycle(device)
    report(records, args.json, baseline="unfused")


if __name__ == "__main__":
    main()

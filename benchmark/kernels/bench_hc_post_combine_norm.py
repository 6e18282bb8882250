"""The mHC boundary without its statistics: SGLang's post and the next combine+norm in one
launch, vs the two steps.

DeepSeek-V4.1's hidden size (H = 5120) at the decode/verify row counts. This is the boundary's
critical path where SGLang runs the next statistics on its stats stream beside the sublayer.
Arms, op ``hc_post_combine_norm``: ``sglang-0.5.23`` (SGLang's own ``post`` and ``combine``
as its chain dispatches them, our hooks out), ``unfused`` (SGLang's post, then our
``hc_combine_norm``: what the plugin runs there without the fusion) and ``ours``
(``hc_post_combine_norm``, checked bit-equal to ``unfused`` first). The call through SGLang's
chain is ``benchmark/call_sites.py``'s ``hc_post_combine_norm`` site. Op
``hc_post_combine_norm_quant_fp8``, the same and then the FP8 groups the next attention's
``wqkv_a`` linear quantizes its input into on SM90 (``sglang_per_token_group_quant_fp8(x, 32,
scale_ue8m0=True)``): ``sglang-0.5.23`` (SGLang's two steps, then its quantizer), ``unfused``
(``hc_post_combine_norm``, then SGLang's quantizer) and ``ours`` (``hc_post_combine_norm``
writing the groups in its launch, checked bit-equal to SGLang's quantizer of its normed rows).

    python benchmark/kernels/bench_hc_post_combine_norm.py --record [--rows ""] [--overlap 8,64]

``--overlap MB,...`` also times what the form is for: a BS 1 verify cycle's 80 boundaries
through SGLang's chain (``run_attn_post`` with the consumer's boundary, the consumer's
``combine``), each followed by a stand-in for its sublayer (:data:`STAND_INS`: a bf16 GEMM of
the normed rows reading MB megabytes of weights, or an MB copy on every SM), op
``hc_boundary_overlap``, each record with its arm's fire counts. Arms: ``sglang-0.5.23`` (SGLang
as it runs an SM90 verify: no stats stream, the statistics inside each post), ``ours`` (the
plugin as its policy has it: the fused boundary, statistics inline), ``ours, stats stream``
(SGLang's stats stream given to every post, as SGLang gives it on Blackwell: the statistics of
each residual beside its sublayer, hc_post_combine_norm on the critical path, forced) and
``sglang-0.5.23, stats stream`` (SGLang's own functions given the stream); and ``ours,
dependent pair`` and ``ours, stats stream, dependent pair``, the two ``ours`` arms with the
small-row kernel launched as its dependent pair of grids, whose CTAs need not all find SMs at
once (``hc_mix_stats_plan.ROWS_KERNEL_DEPENDENT``). Per cycle, stand-ins included; their time
alone is the arm ``sublayer stand-ins``.
"""

from __future__ import annotations

import contextlib
import importlib
import os

import torch
from bench_hc_boundary import inputs
from common import (
    groups_exact,
    parser,
    record,
    report,
    sgl_kernel_rmsnorm,
    sglang_group_quantizer,
    timed,
)

from dsv41_kernels.calibration import callers
from dsv41_kernels.calibration.drivers import one_rank_layout
from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.ops.mhc import hc_mix_stats_plan
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm
from dsv41_kernels.ops.mhc.hc_post_combine_norm import (
    hc_post_combine_norm,
    hc_post_combine_norm_admission,
)
from dsv41_kernels.ops.mhc.quant_out import empty_quant_out

EPS = 1e-6
OP = "hc_post_combine_norm"


def measure(m: int, device, layer, mhc) -> list[dict]:
    y, residual, post, comb, pre = inputs(m, device, seed=m)
    cfg, nxt = layer.attn_hc.cfg, layer.ffn_hc
    weight = nxt.norm.weight
    shape = f"[{m}, 4, 5120] bf16"

    def sglang_post():
        with callers.sglang_functions(mhc), one_rank_layout():
            return mhc.post(cfg, y, residual, post, comb)

    def sglang():
        updated = sglang_post()
        with callers.sglang_functions(mhc):
            return updated, mhc.combine(nxt, mhc.HcState(updated, pre))

    def unfused():
        updated = sglang_post()
        return updated, hc_combine_norm(updated.flatten(1), pre, weight, EPS)

    def fused():
        return hc_post_combine_norm(y, residual, post, comb, pre, weight, EPS)

    exact = bit_mismatches(fused(), unfused()) == 0
    kernel = hc_post_combine_norm_admission(y, residual, post, comb, pre, weight).kernel
    quantize, quant_out = sglang_group_quantizer()[0], empty_quant_out(m, 5120, device)

    def ours_groups():
        return hc_post_combine_norm(y, residual, post, comb, pre, weight, EPS, quant_out=quant_out)

    exact_groups = groups_exact(quant_out, quantize(ours_groups()[1]))
    quant_op, quant_shape = f"{OP}_quant_fp8", f"{shape} -> [{m}, 5120] e4m3"
    return [
        timed(OP, shape, "sglang-0.5.23", sglang),
        timed(OP, shape, "unfused", unfused),
        timed(OP, shape, "ours", fused, exact=exact, kernel=kernel),
        timed(quant_op, quant_shape, "sglang-0.5.23", lambda: quantize(sglang()[1])),
        timed(quant_op, quant_shape, "unfused", lambda: quantize(fused()[1])),
        timed(quant_op, quant_shape, "ours", ours_groups, exact=exact_groups, kernel=kernel),
    ]


STAND_INS = ("gemm", "copy")
"""Sublayer stand-ins: ``gemm``, the normed rows times MB megabytes of bf16 weights (a decode
GEMM, which may leave SMs idle beside it); ``copy``, MB megabytes copied on every SM (a
sublayer that holds the whole GPU, as FlashMLA's split decode or a persistent MoE GEMM do)."""
COUNTED = (
    "hc_boundary._post_fusion",
    "hc_post_combine_norm._post_fusion",
    "hc_mix_stats._mix_stats_impl",
)
"""The hooks whose fire counts each overlap record keeps (a declined arm shows there)."""


@contextlib.contextmanager
def forced(value: str):
    """``DSV41_KERNELS_FORCE`` set to ``value`` inside the block (warm-up and capture)."""
    old = os.environ.get("DSV41_KERNELS_FORCE")
    os.environ["DSV41_KERNELS_FORCE"] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ["DSV41_KERNELS_FORCE"]
        else:
            os.environ["DSV41_KERNELS_FORCE"] = old


@contextlib.contextmanager
def patched(module, name: str, value):
    """``module.name`` set to ``value`` inside the block."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def overlap(mb: int, stand_in: str, device, layers, mhc) -> list[dict]:
    """The 80 boundaries of a cycle with a ``stand_in`` of ``mb`` MB after each combine, in the
    arms of the module's ``--overlap``, each record with the fire counts of its capture."""
    from dsv41_kernels.sglang_plugin import dispatch
    from dsv41_kernels.timing import graph_time_us

    gen = torch.Generator().manual_seed(2)
    sublayers, nexts = callers.cycle_boundaries(layers)
    rows, hidden = callers.VERIFY_ROWS, callers.HIDDEN
    ys = [torch.randn(rows, hidden, generator=gen).bfloat16().to(device) for _ in sublayers]
    first = torch.randn(rows, 4, hidden, generator=gen).bfloat16().to(device)
    x0 = torch.randn(rows, hidden, generator=gen).bfloat16().to(device)
    weight = torch.randn(hidden, mb * 2**20 // (2 * hidden), device=device).bfloat16()
    source, target = (torch.empty(mb * 2**20 // 2, device=device).bfloat16() for _ in range(2))

    def sublayer(x):
        if stand_in == "gemm":
            torch.matmul(x, weight)
        else:
            target.copy_(source)

    def cycle(stream):
        residual, stats, x = first, None, x0
        mhc.fork_stats_stream(stream)  # the first post's statistics read `first`
        for i, hc in enumerate(sublayers):
            sublayer(x)
            state = mhc.run_attn_post(
                hc, ys[i], residual, stats_stream=stream, next=nexts[i], world_size=1,
                precomputed=stats,
            )  # fmt: skip
            if nexts[i] is not None:
                mhc.fork_stats_stream(stream)  # as the layers fork before each combine
                x = mhc.combine(sublayers[i + 1], state)
            residual, stats = state.streams, state.stats

    def sglang(stream):
        with callers.sglang_functions(mhc, "_mix_stats_impl", "_combine", "_post_fusion"):
            return cycle(stream)

    def ours_overlapped(stream):
        with forced("hc_boundary,hc_mix_stats,hc_combine_norm"):
            return cycle(stream)

    def dependent(run):
        """``run`` with the small-row kernel's plans made as its dependent pair."""

        def pair(stream):
            with patched(hc_mix_stats_plan, "ROWS_KERNEL_DEPENDENT", True):
                return run(stream)

        return pair

    shape = f"80 x [6, 4, 5120] bf16 + {mb} MB {stand_in} stand-ins"
    arms = (
        ("sglang-0.5.23", lambda stream: sglang(None)),
        ("ours", lambda stream: cycle(None)),
        ("ours, dependent pair", dependent(lambda stream: cycle(None))),
        ("ours, stats stream", ours_overlapped),
        ("ours, stats stream, dependent pair", dependent(ours_overlapped)),
        ("sglang-0.5.23, stats stream", sglang),
        ("sublayer stand-ins", lambda stream: [sublayer(x0) for _ in sublayers]),
    )
    records = []
    for arm, run in arms:
        stream = torch.cuda.Stream(device)  # each arm its own: a failed capture spoils no other
        dispatch.reset()
        fields = {"per_cycle": 1, "stand_in": stand_in}
        try:
            us = graph_time_us(lambda: run(stream), inner=2, repeats=20)
        except Exception as e:  # an arm that cannot run here (SGLang's tilelang absent, say)
            us, fields["error"] = None, f"{type(e).__name__}: {e}"[:200]
        counts = dispatch.fire_counts()
        fields["fire_counts"] = {hook: counts[hook] for hook in COUNTED if hook in counts}
        records.append(record("hc_boundary_overlap", shape, arm, us, **fields))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default="1,6,12,24,31,48,64,96,128,384")
    p.add_argument("--overlap", default="", help="also the cycle with MB,... sublayer stand-ins")
    args = p.parse_args()
    device = torch.device("cuda")
    try:
        mhc = importlib.import_module("sglang.srt.models.deepseek_v4_mhc")
    except Exception as e:  # ImportError, or whatever a half-importable SGLang raises
        why = f"SGLang does not import here: {type(e).__name__}: {e}"[:200]
        report([record(OP, "[·, 4, 5120] bf16", "sglang-0.5.23", None, error=why)], args.json)
        return
    from sglang.srt.plugins import load_plugins

    load_plugins()
    stack = contextlib.ExitStack()
    stack.enter_context(sgl_kernel_rmsnorm())  # SGLang's norm where sgl_kernel is a stand-in
    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(0), device)
    rows = [int(m) for m in args.rows.split(",") if m]  # --rows "": the overlap alone
    records = [r for m in rows for r in measure(m, device, layer, mhc)]
    if args.overlap:
        from dsv41_kernels.calibration.drivers import one_rank_layout

        gen = torch.Generator().manual_seed(1)
        layers = [callers.v41_decoder_layer(gen, device, layer_id=i) for i in range(40)]
        with one_rank_layout():
            for mb in map(int, args.overlap.split(",")):
                for stand_in in STAND_INS:
                    records += overlap(mb, stand_in, device, layers, mhc)
    stack.close()
    report(records, args.json, baseline="unfused")


if __name__ == "__main__":
    main()

"""The mHC boundary without its statistics: SGLang's post and the next combine+norm in one
launch, vs the two steps.

DeepSeek-V4.1's hidden size (H = 5120) at the decode/verify row counts. This is the boundary's
critical path where SGLang runs the next statistics on its stats stream beside the sublayer.
Arms, op ``hc_post_combine_norm``: ``sglang-0.5.23`` (SGLang's own ``post`` and ``combine``
as its chain dispatches them, our hooks out), ``unfused`` (SGLang's post, then our
``hc_combine_norm``: what the plugin runs there without the fusion) and ``ours``
(``hc_post_combine_norm``, checked bit-equal to ``unfused`` first). The call through SGLang's
chain is ``benchmark/call_sites.py``'s ``hc_post_combine_norm`` site.

    python benchmark/kernels/bench_hc_post_combine_norm.py --record
"""

from __future__ import annotations

import importlib

import torch
from common import parser, record, report, timed

from dsv41_kernels.calibration import callers
from dsv41_kernels.calibration.drivers import one_rank_layout
from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm
from dsv41_kernels.ops.mhc.hc_post_combine_norm import (
    hc_post_combine_norm,
    hc_post_combine_norm_admission,
)

EPS = 1e-6
OP = "hc_post_combine_norm"


def inputs(m: int, device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(m, 5120, generator=gen).bfloat16()
    residual = torch.randn(m, 4, 5120, generator=gen).bfloat16()
    post = 2 * torch.rand(m, 4, generator=gen)
    comb = torch.rand(m, 4, 4, generator=gen)
    comb = comb / comb.sum(1, keepdim=True)
    pre = torch.rand(m, 4, generator=gen) + 0.1
    return tuple(t.to(device) for t in (y, residual, post, comb, pre))


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
    return [
        timed(OP, shape, "sglang-0.5.23", sglang),
        timed(OP, shape, "unfused", unfused),
        timed(OP, shape, "ours", fused, exact=exact, kernel=kernel),
    ]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default="1,6,12,24,31,48,64,96,128,384")
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
    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(0), device)
    records = [r for m in map(int, args.rows.split(",")) for r in measure(m, device, layer, mhc)]
    report(records, args.json, baseline="unfused")


if __name__ == "__main__":
    main()

"""Session 9 probe 1: the CUDA finisher (a dependent launch after the CUDA projection) against
session 8's Triton finisher on the same partials, timed in CUDA graphs: the whole op at its
default shape, at every finisher tile (rows a CTA), the projection alone, and the projection
followed by the Triton finisher (session 8's op). Usage: python3 finish_probe.py OUT.json"""
import dataclasses, json, sys
import torch, triton
from dsv41_kernels.cases.hc_mix_stats import example_inputs, reference_with_mix, mix_relative_error, stats_relative_error
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc import hc_mix_stats_kernels as K
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats
from dsv41_kernels.timing import graph_time_us

module = load_module("hc_mix_stats")
out = []


def triton_finish(part, sqsum, scale, base, pre, post, comb, mix, cfg, k):
    m = part.shape[1]
    step = min(triton.next_power_of_2(cfg.splits), max(1, K._FINISH_TILE // cfg.finish_rows))
    K._mix_finish_kernel[(triton.cdiv(m, cfg.finish_rows),)](
        part, sqsum, scale, base, pre, post, comb, mix, m, cfg.splits, float(k), 1e-6, 1e-6, 2.0,
        PART_N=32, COMPENSATED=False, LO_COLUMN=32, ITERS=20, FAST_RCP=True, BLOCK_S=step,
        BLOCK_R=cfg.finish_rows, num_warps=4)


for m in (128, 256, 512, 1024, 2048, 4096, 16384, 65536):
    x = torch.randn(m, 20480, device="cuda").to(torch.bfloat16)
    _, fn, scale, base = example_inputs(1, 5120, device="cuda", seed=m)
    holder = HcDerivedWeights(fn)
    cfg = K.split_k_config("compensated", m, 20480, 132, cuda=True, wgmma=True)
    part = torch.empty((cfg.splits, m, 32), device="cuda")
    sq = torch.empty((cfg.splits, m), device="cuda")
    outs = [torch.empty(s, device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4), (m, 24))]
    proj = lambda: module.hc_mix_partials_tf32(x, fn, holder.lo, part, sq, True, cfg.block_m)
    r = {"m": m, "splits": cfg.splits, "block_m": cfg.block_m, "default_finish_rows": cfg.finish_rows}
    r["projection"] = graph_time_us(proj)
    r["proj+triton_finish"] = graph_time_us(lambda: (proj(), triton_finish(part, sq, scale, base, *outs, cfg, 20480)))
    r["op_default"] = graph_time_us(lambda: hc_mix_stats(x, holder, scale, base))
    for rows in (1, 2, 4, 8, 16, 32):
        c = dataclasses.replace(cfg, finish_rows=rows)
        r[f"op_finish_rows_{rows}"] = graph_time_us(lambda: hc_mix_stats(x, holder, scale, base, config=c))
    if m <= 4096:
        ref = reference_with_mix(x, fn, scale, base)
        ours = hc_mix_stats(x, holder, scale, base, return_mix=True)
        r["mix_err"] = mix_relative_error(ours[3], ref[3])
        r["stats_err"] = stats_relative_error(ours[:3], ref[:3])
    print(json.dumps({k: round(v, 2) if isinstance(v, float) and v > 1e-3 else v for k, v in r.items()}), flush=True)
    out.append(r)
    del x
json.dump(out, open(sys.argv[1], "w"), indent=1)

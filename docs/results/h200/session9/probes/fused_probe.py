"""Session 9 probe 3: the fused wgmma kernel (one launch) against the two launches it replaces
(the same projection's partials, then the Triton finisher: session 8's op), in CUDA graphs, at
the default launch shapes and at other slice counts. Usage: python3 fused_probe.py OUT.json"""
import dataclasses, json, sys
import torch, triton
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc import hc_mix_stats_kernels as K
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats
from dsv41_kernels.timing import graph_time_us

module = load_module("hc_mix_stats")
out = []


def two_launches(x, fn, lo, scale, base, cfg, part, sq, outs):
    module.hc_mix_partials_tf32(x, fn, lo, part, sq, True, cfg.block_m)
    m = x.shape[0]
    step = min(triton.next_power_of_2(cfg.splits), max(1, K._FINISH_TILE // cfg.finish_rows))
    K._mix_finish_kernel[(triton.cdiv(m, cfg.finish_rows),)](
        part, sq, scale, base, *outs, m, cfg.splits, float(x.shape[1]), 1e-6, 1e-6, 2.0,
        PART_N=32, COMPENSATED=False, LO_COLUMN=32, ITERS=20, FAST_RCP=True, BLOCK_S=step,
        BLOCK_R=cfg.finish_rows, num_warps=4)


for m in (1024, 2048, 4096, 8192, 16384, 65536):
    x = torch.randn(m, 20480, device="cuda").to(torch.bfloat16)
    _, fn, scale, base = example_inputs(1, 5120, device="cuda", seed=m)
    holder = HcDerivedWeights(fn)
    cfg = K.split_k_config("compensated", m, 20480, 132, cuda=True, wgmma=True)
    r = {"m": m, "splits": cfg.splits, "block_m": cfg.block_m, "fused_default": K.fuses(cfg, wgmma=True)}
    r["op_default"] = graph_time_us(lambda: hc_mix_stats(x, holder, scale, base))
    outs = [torch.empty(s, device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4), (m, 24))]
    for splits in sorted({cfg.splits, 1, 2, 4, 6, 8} if m <= 8192 else {cfg.splits, 1, 2}):
        c = dataclasses.replace(cfg, block_m=256, splits=splits)
        part = torch.empty((splits, m, 32), device="cuda")
        sq = torch.empty((splits, m), device="cuda")
        r[f"two_launches_S{splits}"] = graph_time_us(lambda: two_launches(x, fn, holder.lo, scale, base, c, part, sq, outs))
        if splits <= K.FUSED_MAX_SPLITS:
            r[f"fused_S{splits}"] = graph_time_us(lambda: module.hc_mix_stats_fused(x, fn, holder.lo, scale, base, *outs, splits, 1e-6, 1e-6, 2.0, 20))
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    out.append(r)
    del x
json.dump(out, open(sys.argv[1], "w"), indent=1)

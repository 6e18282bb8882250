"""Session 9 probe 4: how many clusters of the fused kernel the H200 holds at once (S = 1-8
CTAs a cluster, by cudaOccupancyMaxActiveClusters, from the probe module: fused_probe2.diff),
and the fused kernel against the two launches at 1-2 slices, timed alternately in CUDA graphs.
Usage: python3 fused_probe2.py OUT.json"""
import json, sys
import torch, triton, tvm_ffi
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc import hc_mix_stats_kernels as K
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.timing import graph_time_us

module = load_module("hc_mix_stats")
probe = tvm_ffi.load_module("out/probe9/hc_mix_probe3_sm90a.so")
out = {"max_active_clusters": {s: probe.fused_max_active_clusters(s) for s in range(1, 9)}}
print(out, flush=True)


def two_launches(x, fn, lo, scale, base, cfg, part, sq, outs):
    module.hc_mix_partials_tf32(x, fn, lo, part, sq, True, cfg.block_m)
    m = x.shape[0]
    step = min(triton.next_power_of_2(cfg.splits), max(1, K._FINISH_TILE // cfg.finish_rows))
    K._mix_finish_kernel[(triton.cdiv(m, cfg.finish_rows),)](
        part, sq, scale, base, *outs, m, cfg.splits, float(x.shape[1]), 1e-6, 1e-6, 2.0,
        PART_N=32, COMPENSATED=False, LO_COLUMN=32, ITERS=20, FAST_RCP=True, BLOCK_S=step,
        BLOCK_R=cfg.finish_rows, num_warps=4)


out["timings"] = []
for m in (16384, 32768, 65536):
    x = torch.randn(m, 20480, device="cuda").to(torch.bfloat16)
    _, fn, scale, base = example_inputs(1, 5120, device="cuda", seed=m)
    lo = HcDerivedWeights(fn).lo
    cfg = K.split_k_config("compensated", m, 20480, 132, cuda=True, wgmma=True)
    part = torch.empty((cfg.splits, m, 32), device="cuda")
    sq = torch.empty((cfg.splits, m), device="cuda")
    outs = [torch.empty(s, device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4), (m, 24))]
    r = {"m": m, "splits": cfg.splits, "two_launches": [], "fused": []}
    for _ in range(3):
        r["two_launches"].append(graph_time_us(lambda: two_launches(x, fn, lo, scale, base, cfg, part, sq, outs)))
        r["fused"].append(graph_time_us(lambda: module.hc_mix_stats_fused(x, fn, lo, scale, base, *outs, cfg.splits, 1e-6, 1e-6, 2.0, 20)))
    print(json.dumps({k: [round(v, 2) for v in val] if isinstance(val, list) else val for k, val in r.items()}), flush=True)
    out["timings"].append(r)
    del x
json.dump(out, open(sys.argv[1], "w"), indent=1)

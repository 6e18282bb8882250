"""Session 7 probe 3: the finisher's rows a program, on the final projection (whole-op times)."""
import json, sys, torch
from dataclasses import replace
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats
from dsv41_kernels.ops.mhc.hc_mix_stats_kernels import split_k_config

out = []
for m in (128, 256, 512, 1024, 2048, 4096, 16384, 65536):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    holder = HcDerivedWeights(fn)
    default = split_k_config("compensated", m, x.shape[1], 132, cuda=True, wgmma=True)
    frs = (1, 2, 4, 8) if m < 1024 else (8, 16, 32, 64, 128)
    for fr in sorted(set(frs) | {default.finish_rows}):
        cfg = replace(default, finish_rows=fr)
        t = graph_time_us(lambda: hc_mix_stats(x, holder, scale, base, config=cfg))
        r = dict(m=m, block_m=cfg.block_m, splits=cfg.splits, finish_rows=fr, us=t, default=fr == default.finish_rows)
        out.append(r); print(r, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

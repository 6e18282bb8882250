"""The mHC statistics (compensated, CUDA projection) at 256-4096 rows over launch shapes near a
full machine: 128 or 256 rows a CTA, K slices for 128 / 132 / 256 / 264 CTAs, 4-16 finisher rows,
and the finisher's slices a step (``_FINISH_TILE`` 128, 256, 512 over its rows). Whole op and the
projection alone, CUDA-graph medians (the best of 3), µs; every shape's mix is checked against
the op's bound first. Run from the repository root:
python3 docs/results/h200/session16/probes/mhc_shapes2.py OUT.json"""

import dataclasses
import json
import sys

import torch

from dsv41_kernels.cases.hc_mix_stats import example_inputs, mix_relative_error
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.mhc import hc_mix_stats_kernels as kernels
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.ops.mhc.hc_mix_stats import MIX_RTOL, hc_mix_stats
from dsv41_kernels.reference.mhc import hc_mix
from dsv41_kernels.timing import graph_time_us

sms = torch.cuda.get_device_properties(0).multi_processor_count
module = load_module(kernels.MODULE, 0)
records = []


def best_of(runs):
    best = {k: float("inf") for k in runs}
    for _ in range(3):
        for name, run in runs.items():
            best[name] = min(best[name], graph_time_us(run))
    return best


for m in (256, 512, 1024, 2048, 4096):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    mix64 = hc_mix(x, fn, dtype=torch.float64)
    weights = HcDerivedWeights(fn)
    x2d = x.flatten(1)
    k = x2d.shape[1]
    default = kernels.split_k_config("compensated", m, k, sms, cuda=True, wgmma=True)
    shapes = {("default", kernels._FINISH_TILE): default}
    projections = {}
    for block_m in (128, 256):
        tiles = -(-m // block_m)
        for ctas in (128, 132, 256, 264):
            splits = ctas // tiles
            if splits < 1 or (block_m == 256 and ctas > sms) or splits > 128:
                continue
            projections[(block_m, splits)] = None
            for finish_rows in (4, 8, 16):
                for tile in (128, 256, 512):
                    cfg = dataclasses.replace(default, block_m=block_m, splits=splits,
                                              finish_rows=finish_rows)
                    name = f"{block_m} rows x {splits} slices ({tiles * splits} CTAs), finish {finish_rows}"
                    shapes[(name, tile)] = cfg

    def run_with(cfg, tile):
        def run():
            kernels._FINISH_TILE = tile
            return hc_mix_stats(x, weights, scale, base, mode="compensated", config=cfg,
                                return_mix=True)
        return run

    runs = {}
    for (name, tile), cfg in shapes.items():
        run = run_with(cfg, tile)
        err = mix_relative_error(run()[3], mix64)
        if err <= MIX_RTOL:
            runs[f"{name}, tile {tile}"] = run
        else:
            print(f"m={m} {name} tile {tile}: mix error {err:.2e} over {MIX_RTOL}", flush=True)
    whole = best_of(runs)
    kernels._FINISH_TILE = 128
    proj_runs = {}
    for block_m, splits in [(default.block_m, default.splits), *projections]:
        partial = torch.empty((splits, m, 32), dtype=torch.float32, device="cuda")
        sqsum = torch.empty((splits, m), dtype=torch.float32, device="cuda")
        proj_runs[f"projection {block_m} rows x {splits} slices"] = (
            lambda b=block_m, p=partial, s=sqsum: module.hc_mix_partials_tf32(
                x2d, fn, weights.lo, p, s, True, b))
    proj = best_of(proj_runs)
    print(f"m={m}: default {default}: {whole['default, tile 128']:.2f} us", flush=True)
    for name, us in sorted(whole.items(), key=lambda kv: kv[1])[:10]:
        print(f"  {us:8.2f} us  {name}", flush=True)
    for name, us in sorted(proj.items(), key=lambda kv: kv[1]):
        print(f"  {us:8.2f} us  {name}", flush=True)
    records.append({"m": m, "whole": whole, "projection": proj})
json.dump(records, open(sys.argv[1], "w"), indent=1)

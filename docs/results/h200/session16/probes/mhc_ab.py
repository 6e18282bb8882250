"""A/B in one process: the mHC statistics at main's launch shapes before session 16 (`old`: 256
rows a CTA from 1024 rows, 128 two CTAs an SM below, finisher rows halved below 1024, 128
(slice, row) pairs a finisher step) against the defaults in the tree (`new`). Call 4 ran it with
the first candidate (128 rows one CTA an SM from 256 rows, 256 rows from 2048, at least 4
finisher rows there, 256 pairs a step at every finisher shape) and `pow2`, the same with the
slices rounded down to a power of two; call 5 with the defaults committed (the one-wave shapes
at 256-1024 rows only, capped at one finisher step, 256 pairs a step at up to 8 rows a
program). Batch-invariant mode (its fixed shape) at the old and the new finisher step.
CUDA-graph medians, the best of 5, arms alternating; every arm's mix checked against the op's
bound. Run from the repository root: python3 docs/results/h200/session16/probes/mhc_ab.py OUT.json"""

import json
import sys

import torch
import triton

from dsv41_kernels.cases.hc_mix_stats import example_inputs, mix_relative_error
from dsv41_kernels.ops.mhc import hc_mix_stats_kernels as kernels
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.ops.mhc.hc_mix_stats import MIX_RTOL, hc_mix_stats
from dsv41_kernels.reference.mhc import hc_mix
from dsv41_kernels.timing import graph_time_us

sms = torch.cuda.get_device_properties(0).multi_processor_count
NEW_PAIRS = kernels._FINISH_PAIRS_FEW_ROWS


def old_config(m, k):
    finish_rows = triton.next_power_of_2(triton.cdiv(m, sms))
    finish_rows = max(1, min(32, finish_rows if m >= 1024 else finish_rows // 2))
    rows, per_sm = (256, 1) if m >= 1024 else (128, 2)
    splits = max(1, min(per_sm * sms // triton.cdiv(m, rows), 128, k // 64))
    return kernels.SplitKConfig(rows, 64, splits, 8, 4, finish_rows)


def arm(x, weights, scale, base, mode, cfg, pairs):
    def run():
        kernels._FINISH_PAIRS_FEW_ROWS = pairs
        return hc_mix_stats(x, weights, scale, base, mode=mode, config=cfg, return_mix=True)
    return run


records = []
cases = [("compensated", m) for m in (128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)]
cases += [("batch_invariant", m) for m in (6, 1024)]
for mode, m in cases:
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    mix64 = hc_mix(x, fn, dtype=torch.float64)
    weights = HcDerivedWeights(fn)
    k = x.flatten(1).shape[1]
    if mode == "compensated":
        new = kernels.split_k_config(mode, m, k, sms, cuda=True, wgmma=True)
        runs = {"old": arm(x, weights, scale, base, mode, old_config(m, k), 128),
                "new": arm(x, weights, scale, base, mode, None, NEW_PAIRS)}
        shapes = f"old {old_config(m, k)}, new {new}"
    else:
        runs = {"old": arm(x, weights, scale, base, mode, None, 128),
                "new": arm(x, weights, scale, base, mode, None, NEW_PAIRS)}
        shapes = "the fixed shape"
    errors = {name: mix_relative_error(run()[3], mix64) for name, run in runs.items()}
    assert all(e <= MIX_RTOL for e in errors.values()), errors
    times = {name: [] for name in runs}
    for _ in range(5):
        for name, run in runs.items():
            times[name].append(graph_time_us(run))
    best = {name: min(t) for name, t in times.items()}
    line = "  ".join(f"{name} {us:7.2f}" for name, us in best.items())
    print(f"{mode:15s} m={m:5d}  {line}  new/old {best['new'] / best['old']:.3f}", flush=True)
    records.append({"mode": mode, "m": m, "shapes": shapes, "best": best, "all": times,
                    "mix_rel_err": errors})
kernels._FINISH_PAIRS_FEW_ROWS = NEW_PAIRS
json.dump(records, open(sys.argv[1], "w"), indent=1)

"""One launch each: the wgmma projection at 4096 rows (256 rows a CTA) and the whole op at 1024."""
import torch
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats

for m in (4096, 1024):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    holder = HcDerivedWeights(fn)
    for _ in range(2):
        hc_mix_stats(x, holder, scale, base)
    torch.cuda.synchronize()

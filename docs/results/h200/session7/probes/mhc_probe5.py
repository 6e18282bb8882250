"""Session 7 probe 5: wgmma batches a chunk and stages (bits and times)."""
import json, sys, torch, triton
from dsv41_kernels.jit import load_module
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32

mod = load_module("hc_mix_stats")
bits = lambda t: t.view(torch.int32)
VARIANTS = {0: (2, 4, 1), 1: (4, 4, 1), 2: (4, 5, 1), 3: (4, 4, 2), 4: (4, 5, 2), 5: (2, 4, 2), 6: (4, 4, 4)}
def per_sm(w, s):
    return 2 if 2 * (s * (12288 + 64 * w * 128) + 1024) <= 233472 else 1
out = {"bits": [], "proj": []}
for m in (300, 4096):
    x, fn, _, _ = example_inputs(m, 5120, device="cuda", seed=500 + m)
    hi, lo = split_tf32(fn)
    ref = [torch.empty(8, m, 32, device="cuda"), torch.empty(8, m, device="cuda")]
    mod.hc_mix_partials_tf32(x, fn, lo, *ref, True, 128)
    for v in VARIANTS:
        got = [torch.full_like(ref[0], 7.0), torch.full_like(ref[1], 7.0)]
        mod.hc_mix_partials_probe(x, fn, lo, *got, v)
        r = dict(m=m, v=v, equal=all(torch.equal(bits(a), bits(b)) for a, b in zip(got, ref)))
        print(r, flush=True); out["bits"].append(r)
for m in (256, 1024, 4096, 16384):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    lo = HcDerivedWeights(fn).lo
    for v, (w, s, b) in VARIANTS.items():
        splits = max(1, min(128, per_sm(w, s) * 132 // triton.cdiv(m, 64 * w)))
        part = torch.empty((splits, m, 32), device="cuda"); sq = torch.empty((splits, m), device="cuda")
        t = graph_time_us(lambda: mod.hc_mix_partials_probe(x, fn, lo, part, sq, v))
        out["proj"].append(dict(m=m, v=v, splits=splits, us=t))
        print(f"m={m} v={v} W={w} S={s} B={b} splits={splits} proj={t:.2f}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

"""Session 7 probe 2: wgmma launch-shape variants (bits and times), finisher cost by splits."""
import json, sys, torch, triton
from dsv41_kernels.jit import load_module
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats
from dsv41_kernels.ops.mhc.hc_mix_stats_kernels import split_k_config, num_sms, SplitKConfig

mod = load_module("hc_mix_stats")
bits = lambda t: t.view(torch.int32)
VARIANTS = {0: (2, 4), 1: (4, 4), 2: (4, 3), 3: (3, 4), 4: (1, 4), 5: (2, 3), 6: (3, 3), 7: (1, 8)}
def per_sm(w, s):
    smem = s * (12288 + 64 * w * 128)
    return 2 if 2 * (smem + 1024) <= 233472 else 1
out = {"bits": [], "proj": [], "finish": []}
for m in (1, 300, 4096):
    x, fn, _, _ = example_inputs(m, 5120, device="cuda", seed=400 + m)
    if m < 4096:
        fn = fn * torch.logspace(-30, 30, fn.shape[1], device="cuda")
    hi, lo = split_tf32(fn)
    ref = None
    for v in VARIANTS:
        part = torch.full((8, m, 32), 7.0, device="cuda"); sq = torch.full((8, m), 7.0, device="cuda")
        mod.hc_mix_partials_probe(x, fn, lo, part, sq, v)
        if ref is None:
            mod.hc_mix_partials_tf32(x, fn, lo, part2 := torch.full_like(part, 7.0), sq2 := torch.full_like(sq, 7.0), True)
            ref = (part2, sq2)
        r = dict(m=m, v=v, equal=torch.equal(bits(part), bits(ref[0])) and torch.equal(bits(sq), bits(ref[1])))
        print(r, flush=True); out["bits"].append(r)
for m in (128, 256, 512, 1024, 2048, 4096, 16384, 65536):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    holder = HcDerivedWeights(fn)
    row = dict(m=m)
    for v, (w, s) in VARIANTS.items():
        rows = 64 * w
        fill = per_sm(w, s) * 132 // triton.cdiv(m, rows)
        for splits in sorted({max(1, min(128, fill)), max(1, min(128, fill // 2)), max(1, min(128, 2 * fill))}) if m <= 4096 else [max(1, min(128, fill))]:
            part = torch.empty((splits, m, 32), device="cuda"); sq = torch.empty((splits, m), device="cuda")
            t = graph_time_us(lambda: mod.hc_mix_partials_probe(x, fn, holder.lo, part, sq, v))
            out["proj"].append(dict(m=m, v=v, splits=splits, us=t))
            print(f"m={m} v={v} W={w} S={s} splits={splits} proj={t:.2f}", flush=True)
    default = split_k_config("compensated", m, x.shape[1], 132, cuda=True)
    for splits in sorted({default.splits, max(1, default.splits // 2), max(1, default.splits // 4), min(128, 2 * default.splits)}) if m <= 4096 else [default.splits]:
        for fr in ((4, 8, 16) if m <= 4096 else (default.finish_rows,)):
            cfg = SplitKConfig(128, 64, splits, 8, 4, fr)
            part = torch.empty((splits, m, 32), device="cuda"); sq = torch.empty((splits, m), device="cuda")
            p = graph_time_us(lambda: mod.hc_mix_partials_tf32(x, fn, holder.lo, part, sq, True))
            whole = graph_time_us(lambda: hc_mix_stats(x, holder, scale, base, config=cfg))
            r = dict(m=m, splits=splits, finish_rows=fr, proj=p, whole=whole, finish=whole - p, default=(splits == default.splits and fr == default.finish_rows))
            out["finish"].append(r); print(r, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

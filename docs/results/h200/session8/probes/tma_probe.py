"""Session 8 probe: the TMA wgmma projection against the cp.async one (bits and times)."""
import json, sys, torch, triton, tvm_ffi
from dsv41_kernels.jit import load_module
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32
from dsv41_kernels.ops.mhc.hc_mix_stats_kernels import split_k_config

new = load_module("hc_mix_stats")
old = tvm_ffi.load_module("out/probe8/old_sm90a.so")
bits = lambda t: t.view(torch.int32)
out = {"bits": [], "proj": []}
for m in (1, 37, 300, 1000, 4096 + 17):
    for rows in (128, 256):
        x, fn, _, _ = example_inputs(m, 5120, device="cuda", seed=700 + m)
        if m == 300:
            x[5, 100] = float("inf"); x[7, 3] = float("nan"); fn[3, 17] = float("nan")
        hi, lo = split_tf32(fn)
        splits = 7
        ref = [torch.full((splits, m, 32), 5.0, device="cuda"), torch.full((splits, m), 5.0, device="cuda")]
        old.hc_mix_partials_tf32(x, fn, lo, *ref, True, rows)
        got = [torch.full_like(ref[0], 7.0), torch.full_like(ref[1], 7.0)]
        new.hc_mix_partials_tf32(x, fn, lo, *got, True, rows)
        torch.cuda.synchronize()
        r = dict(m=m, rows=rows, equal=all(torch.equal(bits(a), bits(b)) for a, b in zip(got, ref)))
        print(r, flush=True); out["bits"].append(r)
# a strided x (row stride > K)
xs = torch.randn(500, 20480 + 64, device="cuda").to(torch.bfloat16)[:, :20480]
fn = example_inputs(1, 5120, device="cuda", seed=3)[1]; lo = split_tf32(fn)[1]
ref = [torch.empty(5, 500, 32, device="cuda"), torch.empty(5, 500, device="cuda")]
got = [torch.empty_like(ref[0]), torch.empty_like(ref[1])]
old.hc_mix_partials_tf32(xs, fn, lo, *ref, True, 256); new.hc_mix_partials_tf32(xs, fn, lo, *got, True, 256)
r = dict(m=500, strided=True, equal=all(torch.equal(bits(a), bits(b)) for a, b in zip(got, ref)))
print(r, flush=True); out["bits"].append(r)
for m in (128, 256, 512, 1024, 2048, 4096, 16384, 65536):
    x = torch.randn(m, 20480, device="cuda").to(torch.bfloat16)
    fn = example_inputs(1, 5120, device="cuda", seed=m)[1]
    lo = HcDerivedWeights(fn).lo
    cfg = split_k_config("compensated", m, x.shape[1], 132, cuda=True, wgmma=True)
    variants = [(cfg.block_m, cfg.splits)]
    if m in (1024, 2048, 4096):
        variants += [(128, max(1, min(128, 264 // triton.cdiv(m, 128))))]
    for rows, splits in variants:
        part = torch.empty((splits, m, 32), device="cuda"); sq = torch.empty((splits, m), device="cuda")
        for name, mod in (("old", old), ("new", new)):
            t = graph_time_us(lambda: mod.hc_mix_partials_tf32(x, fn, lo, part, sq, True, rows))
            gb = x.numel() * 2 / t / 1e3
            out["proj"].append(dict(m=m, rows=rows, splits=splits, kernel=name, us=t, tbps=gb))
            print(f"m={m} rows={rows} splits={splits} {name}: {t:.2f} us {gb:.2f} TB/s", flush=True)
    del x
json.dump(out, open(sys.argv[1], "w"), indent=1)

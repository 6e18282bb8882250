"""Session 8 probe 4: the pipelined TMA wgmma projection: bits against the cp.async kernel
(session 7) and the launch shapes (warpgroups, stages, K slices) timed."""
import json, sys, torch, triton, tvm_ffi
from dsv41_kernels.jit import load_module
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32

new = load_module("hc_mix_stats")
old = tvm_ffi.load_module("out/probe8/old_sm90a.so")
probe = tvm_ffi.load_module("out/probe8/probe2_sm90a.so")
bits = lambda t: t.view(torch.int32)
out = {"bits": [], "proj": []}
for m in (1, 37, 300, 1000, 4096 + 17):
    for rows in (128, 256):
        x, fn, _, _ = example_inputs(m, 5120, device="cuda", seed=700 + m)
        if m == 300:
            x[5, 100] = float("inf"); x[7, 3] = float("nan"); fn[3, 17] = float("nan")
        hi, lo = split_tf32(fn)
        for splits in (1, 7, 320):
            ref = [torch.full((splits, m, 32), 5.0, device="cuda"), torch.full((splits, m), 5.0, device="cuda")]
            old.hc_mix_partials_tf32(x, fn, lo, *ref, True, rows)
            got = [torch.full_like(ref[0], 7.0), torch.full_like(ref[1], 7.0)]
            new.hc_mix_partials_tf32(x, fn, lo, *got, True, rows)
            torch.cuda.synchronize()
            r = dict(m=m, rows=rows, splits=splits, equal=all(torch.equal(bits(a), bits(b)) for a, b in zip(got, ref)))
            print(r, flush=True); out["bits"].append(r)
SHAPES = [(2, 4, 2), (2, 6, 1), (4, 4, 1), (4, 3, 1), (3, 4, 1)]
for m in (512, 1024, 2048, 4096, 16384, 65536):
    x = torch.randn(m, 20480, device="cuda").to(torch.bfloat16)
    fn = example_inputs(1, 5120, device="cuda", seed=m)[1]
    lo = HcDerivedWeights(fn).lo
    for w, stages, per_sm in SHAPES:
        tiles = triton.cdiv(m, 64 * w)
        fills = {max(1, min(128, f * per_sm * 132 // tiles)) for f in (1, 2)}
        if tiles < 132:
            fills.add(max(1, min(128, per_sm * 132 // tiles // 2)))
        for splits in sorted(fills):
            part = torch.empty((splits, m, 32), device="cuda"); sq = torch.empty((splits, m), device="cuda")
            t = graph_time_us(lambda: probe.hc_mix_partials_probe(x, fn, lo, part, sq, w, stages))
            r = dict(m=m, warpgroups=w, stages=stages, splits=splits, us=t, tb_s=x.numel() * 2 / t / 1e6)
            out["proj"].append(r)
            print(f"m={m} W={w} stages={stages} splits={splits}: {t:.2f} us {r['tb_s']:.2f} TB/s", flush=True)
    del x
json.dump(out, open(sys.argv[1], "w"), indent=1)

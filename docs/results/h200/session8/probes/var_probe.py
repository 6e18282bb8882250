"""Session 8 probe 3: what bounds a chunk of the TMA wgmma projection (variants, shapes)."""
import json, sys, torch, triton, tvm_ffi
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights

mod = tvm_ffi.load_module("out/probe8/probe_sm90a.so")
NAMES = {0: "full", 1: "no-wgmma", 2: "no-x-loads", 3: "neither"}
out = []
for m in (1024, 4096, 16384):
    x = torch.randn(m, 20480, device="cuda").to(torch.bfloat16)
    fn = example_inputs(1, 5120, device="cuda", seed=m)[1]
    lo = HcDerivedWeights(fn).lo
    shapes = [(256, 4, 1), (128, 4, 2), (256, 3, 1), (128, 6, 1), (192, 4, 1)]
    for rows, stages, per_sm in shapes:
        tiles = triton.cdiv(m, rows)
        for splits in sorted({max(1, min(128, per_sm * 132 // tiles)), max(1, min(128, 2 * per_sm * 132 // tiles))}):
            part = torch.empty((splits, m, 32), device="cuda"); sq = torch.empty((splits, m), device="cuda")
            for v in ((0, 1, 2, 3) if (rows, stages) == (256, 4) else (0,)):
                t = graph_time_us(lambda: mod.hc_mix_partials_probe(x, fn, lo, part, sq, rows, stages, v))
                r = dict(m=m, rows=rows, stages=stages, splits=splits, variant=NAMES[v], us=t,
                         tb_s=x.numel() * 2 / t / 1e6)
                out.append(r)
                print(f"m={m} rows={rows} stages={stages} splits={splits} {NAMES[v]}: {t:.2f} us "
                      f"{r['tb_s']:.2f} TB/s", flush=True)
    del x
json.dump(out, open(sys.argv[1], "w"), indent=1)

"""Session 9 probe 2: where the CUDA finisher's time goes. The probe module (probe1.diff):
hc_mix_finish(..., flags) with flags 1 a dependent launch, 2 no per-row statistics, 4 no loads;
hc_mix_partials_tf32(..., early) with early the projection's launch_dependents at its start."""
import json, sys, torch, triton, tvm_ffi
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc import hc_mix_stats_kernels as K
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.timing import graph_time_us

probe = tvm_ffi.load_module("out/probe9/hc_mix_probe_sm90a.so")
out = []


def triton_finish(part, sqsum, scale, base, pre, post, comb, mix, cfg, k):
    m = part.shape[1]
    step = min(triton.next_power_of_2(cfg.splits), max(1, K._FINISH_TILE // cfg.finish_rows))
    K._mix_finish_kernel[(triton.cdiv(m, cfg.finish_rows),)](
        part, sqsum, scale, base, pre, post, comb, mix, m, cfg.splits, float(k), 1e-6, 1e-6, 2.0,
        PART_N=32, COMPENSATED=False, LO_COLUMN=32, ITERS=20, FAST_RCP=True, BLOCK_S=step,
        BLOCK_R=cfg.finish_rows, num_warps=4)


for m in (128, 1024, 4096, 65536):
    x = torch.randn(m, 20480, device="cuda").to(torch.bfloat16)
    _, fn, scale, base = example_inputs(1, 5120, device="cuda", seed=m)
    lo = HcDerivedWeights(fn).lo
    cfg = K.split_k_config("compensated", m, 20480, 132, cuda=True, wgmma=True)
    part = torch.empty((cfg.splits, m, 32), device="cuda")
    sq = torch.empty((cfg.splits, m), device="cuda")
    outs = [torch.empty(s, device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4), (m, 24))]
    proj = lambda early: probe.hc_mix_partials_tf32(x, fn, lo, part, sq, True, cfg.block_m, early)
    proj(False); torch.cuda.synchronize()
    fin = lambda flags, rows=cfg.finish_rows: probe.hc_mix_finish(part, sq, scale, base, *outs, 20480.0, 1e-6, 1e-6, 2.0, 20, rows, flags)
    r = {"m": m, "splits": cfg.splits, "rows": cfg.finish_rows}
    r["proj"] = graph_time_us(lambda: proj(False))
    r["proj_early"] = graph_time_us(lambda: proj(True))
    r["triton_fin_alone"] = graph_time_us(lambda: triton_finish(part, sq, scale, base, *outs, cfg, 20480))
    for flags in (0, 1, 2, 3, 4, 6):
        r[f"fin_alone_f{flags}"] = graph_time_us(lambda: fin(flags))
    r["proj+triton"] = graph_time_us(lambda: (proj(False), triton_finish(part, sq, scale, base, *outs, cfg, 20480)))
    for early, flags in ((False, 0), (False, 1), (True, 1), (True, 0), (True, 3), (True, 7)):
        r[f"proj{'_early' if early else ''}+fin_f{flags}"] = graph_time_us(lambda: (proj(early), fin(flags)))
    for rows in (1, 4, 16, 32):
        r[f"fin_alone_rows{rows}"] = graph_time_us(lambda: fin(1, rows))
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    out.append(r)
    del x
json.dump(out, open(sys.argv[1], "w"), indent=1)

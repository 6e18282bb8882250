"""Session 7 probe: wgmma vs mma.sync partials (bits), and times of projection / whole op."""
import json, sys, torch
from dsv41_kernels.jit import load_module
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights, split_tf32
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats
from dsv41_kernels.ops.mhc.hc_mix_stats_kernels import split_k_config, num_sms

mod = load_module("hc_mix_stats")
bits = lambda t: t.view(torch.int32)
out = {"bits": [], "times": []}
dev = torch.device("cuda")
for m, seed in ((1, 1), (128, 2), (300, 3), (1024, 4), (4096, 5)):
    x, fn, _, _ = example_inputs(m, 5120, device="cuda", seed=300 + seed)
    if seed <= 3:
        fn = fn * torch.logspace(-30, 30, fn.shape[1], device="cuda")
        fn[0, :8] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-40, -1e-42, 3.4e38], device="cuda")
    hi, lo = split_tf32(fn)
    res = {}
    for name, w, wg in (("sync", fn, False), ("wgmma", fn, True), ("wgmma_hi", hi.contiguous(), True)):
        part = torch.full((8, m, 64), 7.0, device="cuda"); sq = torch.full((8, m), 7.0, device="cuda")
        mod.hc_mix_partials_tf32(x, w, lo, part, sq, wg)
        res[name] = (part, sq)
    torch.cuda.synchronize()
    a, b, c = res["sync"], res["wgmma"], res["wgmma_hi"]
    pe = torch.equal(bits(a[0]), bits(b[0])); se = torch.equal(bits(a[1]), bits(b[1]))
    he = torch.equal(bits(b[0]), bits(c[0])) and torch.equal(bits(b[1]), bits(c[1]))
    fin = torch.isfinite(a[0]) & torch.isfinite(b[0])
    d = ((a[0] - b[0]).abs()[fin].max().item(), a[0].abs()[fin].max().item())
    ds = ((a[1] - b[1]).abs().max().item(), a[1].abs().max().item())
    nf = (torch.isfinite(a[0]) != torch.isfinite(b[0])).sum().item()
    r = dict(m=m, part_equal=pe, sq_equal=se, fn_vs_hi_equal=he, part_maxdiff=d, sq_maxdiff=ds, finite_mismatch=nf)
    print(r, flush=True); out["bits"].append(r)

for m in (128, 256, 512, 1024, 2048, 4096, 16384, 65536):
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    holder = HcDerivedWeights(fn)
    cfg = split_k_config("compensated", m, x.shape[1], num_sms(dev), cuda=True)
    part = torch.empty((cfg.splits, m, 64), device="cuda"); sq = torch.empty((cfg.splits, m), device="cuda")
    row = dict(m=m, splits=cfg.splits)
    for name, wg in (("proj_sync", False), ("proj_wgmma", True)):
        row[name] = graph_time_us(lambda: mod.hc_mix_partials_tf32(x, fn, holder.lo, part, sq, wg))
    row["whole"] = graph_time_us(lambda: hc_mix_stats(x, holder, scale, base))
    row["read_x"] = graph_time_us(lambda: torch.sum(x.view(torch.int32), dim=1, dtype=torch.int32))
    print(row, flush=True); out["times"].append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)

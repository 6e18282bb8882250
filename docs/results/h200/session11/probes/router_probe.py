"""Session 11: the CUDA router's phases (clock64 stamps under graph replay), stripped copies and a
ballot tie-break, CUDA-graph medians, beside the production op."""
import json, statistics, sys
import torch, tvm_ffi
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate

mod = tvm_ffi.load_module("out/probe11/build_router_probe/router_probe.so")
clk = torch.zeros(2, dtype=torch.int64, device="cuda")
mod.clock_probe(clk, 20_000_000); torch.cuda.synchronize()
mhz = clk[0].item() / clk[1].item() * 1e3
print(f"SM clock under a spin: {mhz:.0f} MHz", flush=True)
NAMES = {0: "full copy", 1: "loads+stores (no math)", 2: "math, no rank/slots", 3: "math+rank, no slots", 4: "full, ballot tie-break", 5: "full, rank loads first + branch-free slots"}
PHASES = ["pdl wait", "loads+math", "sync1", "rank", "sync2", "slots", "epilogue div"]
out = {"mhz": mhz, "rows": []}
none = torch.empty(0, dtype=torch.int64, device="cuda")
for T in (1, 6, 64, 256, 1024):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g)
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 129280, (T,), device="cuda", generator=g); ids[::2] = 129264
    w = torch.empty(T, 6, device="cuda"); i = torch.empty(T, 6, dtype=torch.int32, device="cuda"); p = torch.empty_like(i)
    real = lambda: moe_fused_gate(x, bias, bias_alt=alt, input_ids=ids, image_token_id=129264, top_k=6,
                                  renormalize=True, packed_out=p, out_weights=w, out_ids=i)
    rows = [{"T": T, "arm": "moe_fused_gate (ours, op)", "us": graph_time_us(real)}]
    for mode in (0, 5):
        f = lambda mode=mode: mod.router_probe(mode, x, bias, alt, ids, w, i, p, none)
        rows.append({"T": T, "arm": NAMES[mode], "us": graph_time_us(f)})
    # bitwise: ballot variant against the copy, including ties
    xt = x.clone(); xt[:, 100:140] = 0.5
    outs = []
    for mode in (0, 5):
        ww, ii, pp = torch.empty_like(w), torch.empty_like(i), torch.empty_like(p)
        mod.router_probe(mode, xt, bias * 0, alt * 0, ids, ww, ii, pp, none); outs.append((ww, ii, pp))
    same = all(torch.equal(a, b) for a, b in zip(*outs))
    for mode in (0, 5):
        stamps = torch.zeros(100, 8, dtype=torch.int64, device="cuda")
        calls = iter(range(10**9))
        f = lambda mode=mode: mod.router_probe(mode, x, bias, alt, ids, w, i, p, stamps[next(calls) % 100])
        graph_time_us(f, inner=100, repeats=5)
        s = stamps.cpu()
        med = [statistics.median(s[:, k].tolist()) for k in range(8)]
        rows.append({"T": T, "arm": f"stamps mode {mode}", "cum_cycles": med,
                     "phase_cycles": {PHASES[k]: med[k + 1] - med[k] for k in range(7)}})
    for r in rows:
        if "us" in r: print(f"T {T:5d}  {r['arm']:28s} {r['us']:.2f}", flush=True)
        else: print(f"T {T:5d}  {r['arm']:28s} " + ", ".join(f"{k} {v:.0f}" for k, v in r["phase_cycles"].items()), flush=True)
    print(f"T {T:5d}  mode 5 bitwise equal to copy on ties: {same}", flush=True)
    out["rows"] += rows
json.dump(out, open(sys.argv[1], "w"), indent=1)

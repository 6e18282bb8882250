"""Session 11: the router's CUDA kernel before (session 10's module) and after the rank and
slot-loop change, called directly at every token count (beyond the op's CUDA_MAX_TOKENS too),
bitwise compared, CUDA-graph medians."""
import json, sys
import torch, tvm_ffi
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.jit import load_module

old = tvm_ffi.load_module("out/probe11/old_moe_fused_gate.so")
new = load_module("moe_fused_gate", 0)
out, bad = [], 0
none = torch.empty(0, device="cuda")
for E, T in [(384, t) for t in (1, 6, 16, 64, 128, 256, 384, 512, 768, 1024, 2048)] + [(32, 7), (64, 33), (512, 300), (416, 5)]:
    for case in range(3):
        g = torch.Generator(device="cuda").manual_seed(1000 * T + E + case)
        x = torch.randn(T, E, device="cuda", generator=g)
        if case == 1:  # ties and specials
            x = (x * 2).round() / 2
            x[:, :5] = float("nan") if T > 3 else x[:, :5]
            x[::3, 7] = float("inf"); x[1::3, 9] = -float("inf")
        if case == 2:
            x = x[:, :E] * 0  # all equal scores: ties everywhere
        bias = torch.randn(E, device="cuda", generator=g) * (0 if case == 2 else 0.1)
        alt = torch.randn(E, device="cuda", generator=g) * 0.1
        ids = torch.randint(0, 129280, (T,), device="cuda", generator=g); ids[::2] = 129264
        res = []
        for k, shared in ((6, 0), (8, 1), (16, 0)) if case == 0 else ((6, 0),):
            for mod in (old, new):
                w = torch.empty(T, k, device="cuda"); i = torch.empty(T, k, dtype=torch.int32, device="cuda"); p = torch.empty_like(i)
                f = lambda mod=mod, w=w, i=i, p=p, k=k, s=shared: mod.moe_fused_gate_cuda(
                    x, bias, alt, ids, 129264, none, T - 1, w, i, p, s, True, 1e-20, 2.5, False)
                f()
                res.append((w.clone(), i.clone(), p.clone()))
                if case == 0 and k == 6 and E == 384:
                    out.append({"T": T, "arm": "old" if mod is old else "new", "us": graph_time_us(f)})
        for a, b in zip(res[0::2], res[1::2]):
            same = all(torch.equal(u.view(torch.int32), v.view(torch.int32)) for u, v in zip(a, b))
            bad += not same
    tm = [r for r in out if r["T"] == T and E == 384]
    if tm:
        print(f"E {E} T {T:5d}  old {tm[0]['us']:.2f}  new {tm[1]['us']:.2f}", flush=True)
print(f"bitwise mismatching configs old vs new: {bad}", flush=True)
json.dump({"timings": out, "mismatching_configs": bad}, open(sys.argv[1], "w"), indent=1)

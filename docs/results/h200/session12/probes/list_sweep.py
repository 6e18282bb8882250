"""Session 12: the router's CUDA kernel in its layouts: the CTA layout (a thread an expert, the
lists ranked in shared memory), the list layouts with K = 2/3/4/6/8 warps a token (thread (w, g)
scores members w + K i of list g, then warp 0 takes the slots from registers) and the warp
layout (K = 1, 4 or 8 tokens a CTA), beside our Triton kernel; E 384 top-6 (V4.1), CUDA-graph
medians; bits of every layout against the CTA layout."""
import json, sys
import torch
from dsv41_kernels.timing import graph_time_us
import tvm_ffi
from dsv41_kernels.admission import admit
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, TRITON

mod = tvm_ffi.load_module(sys.argv[2])  # this commit's moe_fused_gate module for sm_90a
none = torch.empty(0, device="cuda")
layouts = [("cta", 0, 1), ("k2", 2, 1), ("k3", 3, 1), ("k4", 4, 1), ("k6", 6, 1), ("k8", 8, 1),
           ("warp4", 1, 4), ("warp8", 1, 8)]
rows, mismatches = [], 0
for T in (1, 6, 64, 128, 192, 256, 320, 384, 448, 512, 640, 1024, 2048):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g)
    x[T // 2, :40] = 0.25  # a tied row
    x[T - 1, :8] = torch.tensor([float("nan"), float("inf"), -float("inf"), -100.0, -90.0, 25.0, 1e-40, -0.0])
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 129280, (T,), device="cuda", generator=g); ids[::2] = 129264
    w = torch.empty(T, 6, device="cuda"); i = torch.empty(T, 6, dtype=torch.int32, device="cuda"); p = torch.empty_like(i)
    line, ref = {}, None
    for name, k, tpc in layouts:
        f = lambda k=k, tpc=tpc: mod.moe_fused_gate_cuda(x, bias, alt, ids, 129264, none, T, w, i, p, 0, True, 1e-20, 2.5, False, k, tpc)
        f()
        got = (w.clone(), i.clone(), p.clone())
        if ref is None: ref = got
        mismatches += not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, got))
        line[name] = graph_time_us(f)
    tri = lambda: moe_fused_gate(x, bias, bias_alt=alt, input_ids=ids, image_token_id=129264, top_k=6,
                                 routed_scaling_factor=2.5, packed_out=p, out_weights=w, out_ids=i, admission=admit(TRITON, "forced"))
    tri()
    mismatches += not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, (w, i, p)))
    line["triton"] = graph_time_us(tri)
    rows.append({"T": T, **line})
    print(f"T {T:5d} " + " ".join(f"{k} {v:.2f}" for k, v in line.items()), flush=True)
print(f"layouts whose bits differ from the CTA layout's: {mismatches}", flush=True)
json.dump({"rows": rows, "mismatches": mismatches}, open(sys.argv[1], "w"), indent=1)

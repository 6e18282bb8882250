"""Session 12: the router's CUDA kernel in its two layouts (a CTA a token; a warp a token with
1/2/4/8 tokens a CTA), with the math library's score and with the straight-line score
(gate_straight.cu), beside our Triton kernel; E 384 top-6 (V4.1), CUDA-graph medians; bits of
every variant against the CTA layout. First: the straight-line score against the library's for
all 2^32 fp32 inputs."""
import json, sys
import torch
import tvm_ffi
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.jit import load_module
from dsv41_kernels.admission import admit
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, TRITON

straight = tvm_ffi.load_module(sys.argv[2])
bad = torch.zeros(1, dtype=torch.int64, device="cuda")
first = torch.full((1,), -1, dtype=torch.int32, device="cuda")
straight.compare_scores(bad, first)
torch.cuda.synchronize()
print(f"straight-line score against the library's, all 2^32 inputs: {bad.item()} differ, "
      f"lowest differing bits {first.item() & 0xFFFFFFFF:#010x}", flush=True)

mod = load_module("moe_fused_gate", 0)
none = torch.empty(0, device="cuda")
rows, mismatches = [], 0
for T in (1, 6, 64, 128, 256, 320, 384, 512, 640, 768, 1024, 1536, 2048):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g)
    x[T // 2, :40] = 0.25  # a tied row
    x[T - 1, :8] = torch.tensor([float("nan"), float("inf"), -float("inf"), -100.0, -90.0, 25.0, 1e-40, -0.0])
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 129280, (T,), device="cuda", generator=g); ids[::2] = 129264
    w = torch.empty(T, 6, device="cuda"); i = torch.empty(T, 6, dtype=torch.int32, device="cuda"); p = torch.empty_like(i)
    line, ref = {}, None
    for name, fn in (("lib", mod.moe_fused_gate_cuda), ("straight", straight.gate_straight_cuda)):
        for wt in (0, 1, 2, 4, 8):
            f = lambda fn=fn, wt=wt: fn(x, bias, alt, ids, 129264, none, T, w, i, p, 0, True, 1e-20, 2.5, False, wt)
            f()
            got = (w.clone(), i.clone(), p.clone())
            if ref is None: ref = got
            mismatches += not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, got))
            line[f"{name} {'cta' if wt == 0 else f'warp{wt}'}"] = graph_time_us(f)
    tri = lambda: moe_fused_gate(x, bias, bias_alt=alt, input_ids=ids, image_token_id=129264, top_k=6,
                                 routed_scaling_factor=2.5, packed_out=p, out_weights=w, out_ids=i, admission=admit(TRITON, "forced"))
    tri()
    mismatches += not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, (w, i, p)))
    line["triton"] = graph_time_us(tri)
    rows.append({"T": T, **line})
    print(f"T {T:5d} " + " ".join(f"{k} {v:.2f}" for k, v in line.items()), flush=True)
print(f"variants whose bits differ from the CTA layout's: {mismatches}", flush=True)
json.dump({"rows": rows, "mismatches": mismatches, "score_mismatches": bad.item()}, open(sys.argv[1], "w"), indent=1)

"""Session 11: the router's CUDA kernel with 1, 2 and 4 experts a thread beside our Triton kernel, E 384
top-6 (V4.1), 1..16384 tokens, CUDA-graph medians; bits of 2 and 4 experts a thread against 1."""
import json, sys
import torch
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.jit import load_module
from dsv41_kernels.admission import admit
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, TRITON

mod = load_module("moe_fused_gate", 0)
none = torch.empty(0, device="cuda")
rows, bad = [], 0
for T in (1, 6, 64, 256, 320, 384, 512, 640, 768, 1024, 1536, 2048, 3072, 4096, 8192, 16384):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g)
    x[T // 2, :40] = 0.25  # a tied row
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 129280, (T,), device="cuda", generator=g); ids[::2] = 129264
    w = torch.empty(T, 6, device="cuda"); i = torch.empty(T, 6, dtype=torch.int32, device="cuda"); p = torch.empty_like(i)
    line, ref = {}, None
    for tpc in (1, 2, 4):  # experts a thread
        f = lambda tpc=tpc: mod.moe_fused_gate_cuda(x, bias, alt, ids, 129264, none, T, w, i, p, 0, True, 1e-20, 2.5, False, tpc)
        f()
        got = (w.clone(), i.clone(), p.clone())
        if ref is None: ref = got
        bad += not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, got))
        line[f"cuda per-thread {tpc}"] = graph_time_us(f)
    tri = lambda: moe_fused_gate(x, bias, bias_alt=alt, input_ids=ids, image_token_id=129264, top_k=6,
                                 routed_scaling_factor=2.5, packed_out=p, out_weights=w, out_ids=i, admission=admit(TRITON, "forced"))
    tri()
    bad += not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, (w, i, p)))
    line["triton"] = graph_time_us(tri)
    rows.append({"T": T, **line})
    print(f"T {T:6d}  " + "  ".join(f"{k} {v:.2f}" for k, v in line.items()), flush=True)
print(f"configs whose bits differ from 1 a thread: {bad}", flush=True)
json.dump({"rows": rows, "mismatches": bad}, open(sys.argv[1], "w"), indent=1)

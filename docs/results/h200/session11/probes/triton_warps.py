"""Session 11: our Triton router (E 384, top-6) with 1, 2 and 4 warps a token (the layout only: the
bits are the same), CUDA-graph medians, bits against one warp."""
import json, sys
import torch
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.admission import admit
from dsv41_kernels.ops.moe import moe_fused_gate as op

rows, bad = [], 0
for T in (256, 384, 512, 768, 1024, 1536, 2048, 4096, 16384):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g); x[T // 2, :40] = 0.25; x[1, 3] = float("nan")
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 129280, (T,), device="cuda", generator=g); ids[::2] = 129264
    w = torch.empty(T, 6, device="cuda"); i = torch.empty(T, 6, dtype=torch.int32, device="cuda"); p = torch.empty_like(i)
    line, ref = {}, None
    for nw in (1, 2, 4):
        op._num_warps = lambda block, nw=nw: nw
        f = lambda: op.moe_fused_gate(x, bias, bias_alt=alt, input_ids=ids, image_token_id=129264, top_k=6,
                                      routed_scaling_factor=2.5, packed_out=p, out_weights=w, out_ids=i,
                                      admission=admit(op.TRITON, "forced"))
        f()
        got = (w.clone(), i.clone(), p.clone())
        ref = ref or got
        bad += not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, got))
        line[f"triton {nw} warps"] = graph_time_us(f)
    rows.append({"T": T, **line})
    print(f"T {T:6d}  " + "  ".join(f"{k} {v:.2f}" for k, v in line.items()), flush=True)
print(f"configs whose bits differ from one warp: {bad}", flush=True)
json.dump({"rows": rows, "mismatches": bad}, open(sys.argv[1], "w"), indent=1)

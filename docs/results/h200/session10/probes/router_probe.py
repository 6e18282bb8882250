"""Where the vision router's time goes on the H200: the real kernel against stripped copies
(the same grid, one warp a token, the same dependent launch), CUDA-graph medians."""
import json, sys
import torch, triton, triton.language as tl
from triton.language.extra import libdevice
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate

@triton.jit
def probe_kernel(x_ptr, bias_ptr, alt_ptr, ids_ptr, w_ptr, i_ptr, p_ptr,
                 MODE: tl.constexpr, E: tl.constexpr, BLOCK_E: tl.constexpr, K: tl.constexpr):
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    m = e < E
    x = tl.load(x_ptr + row * E + e, mask=m, other=0.0)
    bias = tl.load(bias_ptr + e, mask=m, other=0.0)
    img = tl.load(ids_ptr + row) == 129264
    alt = tl.load(alt_ptr + e, mask=m, other=0.0)
    bias = tl.where(img, alt, bias)
    if MODE == 1 or MODE == 3:  # no math
        score = x
    else:
        sp = tl.where(x > 20.0, x, libdevice.log1p(libdevice.exp(x)))
        score = tl.sqrt_rn(sp)
    biased = score + bias
    slots = tl.arange(0, 8)
    if MODE <= 1:  # no selection: the first K experts
        w = tl.sum(tl.where(e[None, :] == slots[:, None], biased[None, :], 0.0), 1)
        ids = slots
    else:
        bits = biased.to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
        ordered = tl.where(m, ordered, -(1 << 31))
        sb = score.to(tl.int32, bitcast=True)
        ids = tl.zeros([8], dtype=tl.int32)
        w = tl.zeros([8], dtype=tl.float32)
        for s in tl.static_range(K):
            best = tl.max(ordered, 0)
            ex = tl.min(tl.where(ordered == best, e, BLOCK_E), 0)
            ch = e == ex
            wt = tl.sum(tl.where(ch, sb, 0), 0).to(tl.float32, bitcast=True)
            ordered = tl.where(ch, -(1 << 31), ordered)
            ids = tl.where(slots == s, ex, ids)
            w = tl.where(slots == s, wt, w)
    keep = slots < K
    tl.store(w_ptr + row * K + slots, w, mask=keep)
    tl.store(i_ptr + row * K + slots, ids, mask=keep)
    tl.store(p_ptr + row * K + slots, ids << 16, mask=keep)

NAMES = {0: "math, no selection", 1: "loads and stores only", 2: "math + selection (copy)", 3: "selection, no math"}
out = []
for T in (1, 6, 64):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g)
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 129280, (T,), device="cuda", generator=g)
    w = torch.empty(T, 6, device="cuda"); i = torch.empty(T, 6, dtype=torch.int32, device="cuda")
    p = torch.empty_like(i)
    real = lambda: moe_fused_gate(x, bias, bias_alt=alt, input_ids=ids, image_token_id=129264, top_k=6,
                                  packed_out=p, out_weights=w, out_ids=i)
    out.append({"T": T, "arm": "moe_fused_gate (ours)", "us": graph_time_us(real)})
    for mode in (1, 0, 3, 2):
        f = lambda mode=mode: probe_kernel[(T,)](x, bias, alt, ids, w, i, p, MODE=mode, E=384, BLOCK_E=512, K=6,
                                                 num_warps=1, launch_pdl=True, enable_fp_fusion=False)
        out.append({"T": T, "arm": NAMES[mode], "us": graph_time_us(f)})
    for r in out[-5:]:
        print(f"T {r['T']:3d}  {r['arm']:28s} {r['us']:.2f}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

"""Session 13, call 2: the router's CUDA kernel with the slot loop that moves a winner to its
second best by selects (the prebuilt module) against the kernel before it (gate_old.so,
make_old_router.sh 41b36c1), each in the layout cuda_layout picks, 1-2048 tokens; then from 640
to 65536 tokens the new warp layout (4 and 8 tokens a CTA, forced) beside our Triton kernel and
SGLang's router. V4.1's shape (E 384, top-6, image tokens mixed in, packed ids). Timed back to
back under CUDA-graph replay and with a one-store kernel between calls (its own time taken off).
Bits of every CUDA variant against the Triton kernel."""

import json, sys

sys.path.insert(0, "benchmark/kernels")
import torch
import tvm_ffi
import triton
import triton.language as tl
from common import sglang_function
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.jit import load_module
from dsv41_kernels.admission import admit
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, TRITON, cuda_layout


@triton.jit
def _store(out_ptr):
    tl.store(out_ptr, 1)


flag = torch.zeros(1, dtype=torch.int32, device="cuda")
sep = lambda: _store[(1,)](flag)
sep_us = graph_time_us(sep)
print(f"one store kernel alone: {sep_us:.2f} us", flush=True)
new = load_module("moe_fused_gate", 0).moe_fused_gate_cuda
old = tvm_ffi.load_module(sys.argv[2]).gate_old_cuda
sglang, why = sglang_function("sglang.kernels.ops.moe.moe_fused_gate", "moe_fused_gate")
sms = torch.cuda.get_device_properties(0).multi_processor_count
rows, mismatches = [], []
for T in (
    1,
    6,
    64,
    132,
    256,
    512,
    640,
    1024,
    1536,
    2048,
    2304,
    2560,
    3072,
    4096,
    6144,
    8192,
    16384,
    32768,
    65536,
):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g)
    x[T // 2, :40] = 0.25  # a tied row
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 1000, (T,), device="cuda", generator=g)
    ids[::2] = 129264
    count = torch.tensor([T], dtype=torch.int32, device="cuda")
    w = torch.empty(T, 6, device="cuda")
    i = torch.empty(T, 6, dtype=torch.int32, device="cuda")
    p = torch.empty_like(i)
    call = lambda fn, warps, tpc: fn(
        x, bias, alt, ids, 129264, count, T, w, i, p, 0, True, 1e-20, 1.5, False, warps, tpc
    )
    arms = {}
    if T <= 2048:
        warps, tpc = cuda_layout(T, sms)
        arms[f"old {warps}x{tpc}"] = lambda warps=warps, tpc=tpc: call(old, warps, tpc)
        arms[f"new {warps}x{tpc}"] = lambda warps=warps, tpc=tpc: call(new, warps, tpc)
    if T >= 640:
        for tpc in (4, 8):
            arms[f"new warp x{tpc}"] = lambda tpc=tpc: call(new, 1, tpc)
    arms["triton"] = lambda: moe_fused_gate(
        x,
        bias,
        bias_alt=alt,
        input_ids=ids,
        image_token_id=129264,
        top_k=6,
        routed_scaling_factor=1.5,
        num_token_non_padded=count,
        packed_out=p,
        out_weights=w,
        out_ids=i,
        admission=admit(TRITON, "forced"),
    )
    if sglang is not None:
        sp = torch.empty_like(p)
        arms["sglang-0.5.23"] = lambda: sglang(
            x,
            bias,
            topk=6,
            scoring_func="sqrtsoftplus",
            renormalize=True,
            routed_scaling_factor=1.5,
            bias_alt=alt,
            input_ids=ids,
            bias_alt_token_id=129264,
            num_token_non_padded=count,
            renormalize_epsilon=1e-20,
            packed_out=sp,
            sqrtsoftplus_log1p=True,
        )
    arms["triton"]()
    ref = (w.clone(), i.clone(), p.clone())
    line = {}
    for name, fn in arms.items():
        fn()
        same = (
            torch.equal(sp, ref[2])
            if name == "sglang-0.5.23"
            else all(
                torch.equal(a.view(torch.int32), b.view(torch.int32))
                for a, b in zip(ref, (w, i, p))
            )
        )
        if not same:
            mismatches.append(f"T {T} {name}")
        line[name] = graph_time_us(fn)
        line[name + " +store"] = graph_time_us(lambda fn=fn: (fn(), sep())) - sep_us
    rows.append({"T": T, **line})
    print(f"T {T:5d} " + " | ".join(f"{k} {v:.2f}" for k, v in line.items()), flush=True)
print(f"variants whose bits differ from the Triton kernel's: {mismatches or 'none'}", flush=True)
json.dump(
    {"rows": rows, "mismatches": mismatches, "store_us": sep_us}, open(sys.argv[1], "w"), indent=1
)

"""Session 13: the router's warp layout (a warp a token, 4 or 8 tokens a CTA) from 1024 to 16384
tokens, as shipped (the early start: each CTA lets the next launch begin when the grid is one
wave) and with the early start off (gate_notrigger.so, make_notrigger.sh), beside our Triton
kernel and SGLang's router; V4.1's shape (E 384, top-6, image tokens mixed in, packed ids).
Each timed two ways under CUDA-graph replay: back to back (the op benches' way) and with a
one-store kernel between calls (as in the model, where the router follows the gate GEMM), the
store's own time taken off. Bits of every variant against the shipped kernel."""

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
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, TRITON


@triton.jit
def _store(out_ptr):
    tl.store(out_ptr, 1)


flag = torch.zeros(1, dtype=torch.int32, device="cuda")
sep = lambda: _store[(1,)](flag)
sep_us = graph_time_us(sep)
print(f"one store kernel alone: {sep_us:.2f} us", flush=True)
ship = load_module("moe_fused_gate", 0).moe_fused_gate_cuda
notrig = tvm_ffi.load_module(sys.argv[2]).gate_notrigger_cuda
sglang, why = sglang_function("sglang.kernels.ops.moe.moe_fused_gate", "moe_fused_gate")
none = torch.empty(0, device="cuda")
rows, mismatches = [], 0
for T in (1024, 2048, 2304, 2560, 3072, 4096, 6144, 8192, 16384):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 384, device="cuda", generator=g)
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    alt = torch.randn(384, device="cuda", generator=g) * 0.1
    ids = torch.randint(0, 1000, (T,), device="cuda", generator=g)
    ids[::2] = 129264
    count = torch.tensor([T], dtype=torch.int32, device="cuda")
    w = torch.empty(T, 6, device="cuda")
    i = torch.empty(T, 6, dtype=torch.int32, device="cuda")
    p = torch.empty_like(i)
    arms = {}
    for name, fn in (("ship", ship), ("notrigger", notrig)):
        for tpc in (4, 8):
            arms[f"{name} warp x{tpc}"] = lambda fn=fn, tpc=tpc: fn(
                x, bias, alt, ids, 129264, count, T, w, i, p, 0, True, 1e-20, 1.5, False, 1, tpc
            )
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
    ref = None
    line = {}
    for name, fn in arms.items():
        fn()
        if name != "sglang-0.5.23":
            got = (w.clone(), i.clone(), p.clone())
            if ref is None:
                ref = got
            mismatches += not all(
                torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, got)
            )
        else:
            mismatches += not torch.equal(sp, ref[2])
        line[name] = graph_time_us(fn)
        line[name + " +store"] = graph_time_us(lambda fn=fn: (fn(), sep())) - sep_us
    rows.append({"T": T, **line})
    print(f"T {T:5d} " + " | ".join(f"{k} {v:.2f}" for k, v in line.items()), flush=True)
print(f"variants whose bits differ from the shipped kernel's: {mismatches}", flush=True)
json.dump(
    {"rows": rows, "mismatches": mismatches, "store_us": sep_us}, open(sys.argv[1], "w"), indent=1
)

"""How fast the H200 reads the bytes of the three unmet shapes of issue 15, with no compute:
the floor under any kernel that must read them. CUDA-graph medians (the best of 3), µs and TB/s.

- fp32 [384, 129280] (198.6 MB, the argmax / accept at bs 64) and [256, 129280];
- bf16 [1024, 20480] and [4096, 20480] (42 / 168 MB, the mHC statistics' x).

Arms: torch (x.sum(), x.amax(1)) and a Triton streaming read swept over launch shapes (a grid
of one block a program, or a persistent grid-stride loop of 1-8 programs an SM; 16-64 KiB a
step; 4-16 warps; evict-first loads). Every arm folds what it reads into one word a program so
no load is dead. Run from the repository root:
python3 docs/results/h200/session16/probes/read_ceiling.py OUT.json"""

import json
import sys

import torch
import triton
import triton.language as tl

from dsv41_kernels.timing import graph_time_us


@triton.jit
def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, PERSISTENT: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    if PERSISTENT:
        step = tl.num_programs(0) * BLOCK
        for start in range(pid * BLOCK, n, step):
            v = tl.load(x_ptr + start + offs, mask=start + offs < n, other=0,
                        eviction_policy="evict_first")
            acc ^= v
    else:
        start = pid * BLOCK
        acc = tl.load(x_ptr + start + offs, mask=start + offs < n, other=0,
                      eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


SHAPES = {
    "fp32 [384, 129280]": (384, 129280, torch.float32),
    "fp32 [256, 129280]": (256, 129280, torch.float32),
    "bf16 [1024, 20480]": (1024, 20480, torch.bfloat16),
    "bf16 [4096, 20480]": (4096, 20480, torch.bfloat16),
}
sms = torch.cuda.get_device_properties(0).multi_processor_count
records = []
for name, (rows, cols, dtype) in SHAPES.items():
    x = torch.randn(rows, cols, device="cuda").to(dtype)
    words = x.view(torch.int32).view(-1)
    n = words.numel()
    nbytes = x.numel() * x.element_size()
    runs = {"torch x.sum()": lambda: x.sum(), "torch x.amax(1)": lambda: x.amax(1)}
    out = torch.empty(n // 1024 + 1, dtype=torch.int32, device="cuda")
    for block in (4096, 8192, 16384):
        for warps in (4, 8, 16):
            grid = triton.cdiv(n, block)
            runs[f"triton grid {grid} x {block} w{warps}"] = (
                lambda b=block, w=warps, g=grid: _read[(g,)](words, out, n, BLOCK=b,
                                                             PERSISTENT=False, num_warps=w))
            for per_sm in (1, 2, 4, 8):
                g = per_sm * sms
                runs[f"triton {per_sm}/SM x {block} w{warps}"] = (
                    lambda b=block, w=warps, g=g: _read[(g,)](words, out, n, BLOCK=b,
                                                              PERSISTENT=True, num_warps=w))
    best = {k: float("inf") for k in runs}
    for _ in range(3):
        for arm, run in runs.items():
            best[arm] = min(best[arm], graph_time_us(run))
    ranked = sorted(best.items(), key=lambda kv: kv[1])
    print(f"{name}: {nbytes / 1e6:.1f} MB", flush=True)
    for arm, us in ranked[:6] + [kv for kv in ranked[6:] if kv[0].startswith("torch")]:
        print(f"  {us:8.2f} us  {nbytes / us / 1e6:5.2f} TB/s  {arm}", flush=True)
    records.append({"shape": name, "bytes": nbytes, "us": best})
json.dump(records, open(sys.argv[1], "w"), indent=1)

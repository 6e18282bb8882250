"""SGLang's greedy accept vs the one-launch accept_greedy.

DSpark verifies n = 6 rows of vocab 129280 per request; bs 1, 4, 16, 64, with a cutoff. Arms:
``torch rule`` (torch.argmax and the rule in torch ops), ``sglang-0.5.23`` (SGLang's own
``accept_greedy_triton(..., fused_argmax=True)``, what ``AcceptGreedy.execute`` runs for a
DeepSeek-V4.1 target on CUDA: its split-vocab argmax, inexact on NaN, then the rule in a few
launches) and ``ours`` (the public op: its CUDA kernels on sm_90+, else the Triton kernel; the
record names the kernel), checked equal first (random logits, no NaN). ``--sweep`` also times
the Triton accept's launch shapes at bs 1 (the public op takes a CUDA kernel there, so the
sweep launches the Triton kernel itself).
    python benchmark/kernels/bench_accept_greedy.py --json bench_accept_greedy.json
"""

from __future__ import annotations

import torch
from common import parser, report, sglang_arm, sglang_function, timed

from dsv41_kernels.ops.speculative.accept_greedy import (
    accept_greedy,
    accept_greedy_admission,
    accept_greedy_torch,
    launch_triton,
)
from dsv41_kernels.ops.speculative.argmax_plan import TritonLaunch

VOCAB = 129280
N = 6
SWEEP_CONFIGS = (
    TritonLaunch(2048, 1024, 4),
    TritonLaunch(4096, 1024, 8),
    TritonLaunch(4096, 2048, 8),
    TritonLaunch(8192, 1024, 8),
)


def inputs(bs: int):
    logits = torch.randn(bs * N, VOCAB, device="cuda")
    candidates = torch.randint(0, VOCAB, (bs, N), device="cuda")
    cutoff = torch.full((bs,), N, dtype=torch.int32, device="cuda")
    out = tuple(
        torch.empty(bs, dtype=d, device="cuda") for d in (torch.int32, torch.int64, torch.int32)
    )
    return candidates, logits, cutoff, out


def equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def measure(bs: int) -> list[dict]:
    candidates, logits, cutoff, out = inputs(bs)
    ref = accept_greedy_torch(candidates, logits, cutoff)
    shape = f"bs {bs} x n {N} x {VOCAB} fp32, cutoff"
    kernel = accept_greedy_admission(candidates, logits, cutoff).kernel
    arms = {
        "torch rule": lambda: accept_greedy_torch(candidates, logits, cutoff, out),
        "ours": lambda: accept_greedy(candidates, logits, cutoff_verify_lens=cutoff, out=out),
    }
    sglang, why = sglang_function(
        "sglang.kernels.ops.speculative.dspark.dspark_accept", "accept_greedy_triton"
    )
    run = lambda: sglang(
        candidates=candidates,
        target_logits=logits,
        verify_num_draft_tokens=N,
        cutoff_verify_lens=cutoff,
        fused_argmax=True,
    )
    exact = sglang is not None and all(
        torch.equal(a.to(b.dtype), b) for a, b in zip(run(), ref, strict=True)
    )
    records = [sglang_arm("accept_greedy", shape, sglang, why, run, exact=exact)]
    for arm, run in arms.items():
        exact = equal(run(), ref)
        fields = {"exact": exact, "kernel": kernel if arm == "ours" else None}
        records.append(timed("accept_greedy", shape, arm, run, **fields))
    return records


def sweep() -> list[dict]:
    """Launch shapes of the Triton accept, checked and timed."""
    candidates, logits, _, out = inputs(1)
    ref = accept_greedy_torch(candidates, logits)
    records = []
    for config in SWEEP_CONFIGS:

        def run(config=config):
            launch_triton(candidates, logits, None, out, config)
            return out

        arm = f"triton {config.chunk}/{config.block}/{config.num_warps}"
        shape = f"bs 1 x n {N} x {VOCAB} fp32"
        records.append(timed("accept_greedy", shape, arm, run, exact=equal(run(), ref)))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--bs", default="1,4,16,64")
    p.add_argument("--sweep", action="store_true", help="also time Triton launch shapes")
    args = p.parse_args()
    records = [r for bs in map(int, args.bs.split(",")) for r in measure(bs)]
    if args.sweep:
        records += sweep()
    report(records, args.json, baseline="torch rule")


if __name__ == "__main__":
    main()

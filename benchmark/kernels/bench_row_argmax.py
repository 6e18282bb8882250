"""torch.argmax and SGLang's own argmax vs row_argmax over DSpark's verify logits (vocab 129280).

Arms: ``torch.argmax`` (what the op replaces for other targets), ``sglang-0.5.23`` (SGLang's
``_row_argmax(logits, fused=True)`` as DeepSeek-V4.1's verify calls it: its split-vocab kernel
where it admits the shape, inexact on NaN, else torch.argmax), ``triton`` (the multi-block
Triton kernel alone) and ``ours`` (the public op: the CUDA cluster kernel for up to 8 rows on
sm_90+). Every arm is checked equal to torch.argmax first (random rows, no NaN). ``--sweep``
also times the CUDA cluster kernel's launch shapes (threads x items) at 1, 6 and 64 rows, on
logits full of ties.
    python benchmark/kernels/bench_row_argmax.py --json bench_row_argmax.json
"""

from __future__ import annotations

import torch
from common import parser, report, sglang_arm, sglang_function, timed

from dsv41_kernels.ops.speculative.argmax_reduction import cuda_module
from dsv41_kernels.ops.speculative.row_argmax import launch_triton, row_argmax, row_argmax_admission

VOCAB = 129280
SWEEP_SHAPES = ((128, 16), (256, 8), (256, 16), (512, 4), (512, 8), (1024, 2))


def measure(rows: int) -> list[dict]:
    x = torch.randn(rows, VOCAB, device="cuda")
    ref = torch.argmax(x, dim=-1)
    out = torch.empty(rows, dtype=torch.int64, device="cuda")
    shape = f"[{rows}, {VOCAB}] fp32"
    arms = {
        "torch.argmax": lambda: torch.argmax(x, dim=-1, out=out),
        "triton": lambda: launch_triton(x, out),
        "ours": lambda: row_argmax(x, out=out),
    }
    sglang, why = sglang_function(
        "sglang.kernels.ops.speculative.dspark.dspark_accept", "_row_argmax"
    )
    run = lambda: sglang(x, fused=True)
    exact = sglang is not None and torch.equal(run(), ref)
    records = [sglang_arm("row_argmax", shape, sglang, why, run, exact=exact)]
    for arm, run in arms.items():
        run()
        exact = torch.equal(out, ref)
        kernel = row_argmax_admission(x).kernel if arm == "ours" else None
        records.append(timed("row_argmax", shape, arm, run, exact=exact, kernel=kernel))
    return records


def sweep() -> list[dict]:
    """The CUDA cluster kernel's launch shapes, checked and timed."""
    records = []
    module = cuda_module(torch.device("cuda"))
    for rows in (1, 6, 64):
        x = torch.randn(rows, VOCAB, device="cuda")
        x[:, ::97] = x.max()  # ties everywhere
        ref = torch.argmax(x, dim=-1)
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        for threads, items in SWEEP_SHAPES:
            run = lambda x=x, t=threads, i=items: module.row_argmax_cluster_shape(x, out, t, i)
            run()
            shape = f"[{rows}, {VOCAB}] fp32, ties"
            arm = f"cuda {threads}x{items}"
            records.append(timed("row_argmax", shape, arm, run, exact=torch.equal(out, ref)))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default="1,2,6,8,16,64,128,256,384")
    p.add_argument("--sweep", action="store_true", help="also time the cluster launch shapes")
    args = p.parse_args()
    records = [r for rows in map(int, args.rows.split(",")) for r in measure(rows)]
    if args.sweep:
        records += sweep()
    report(records, args.json, baseline="torch.argmax")


if __name__ == "__main__":
    main()

"""torch.argmax and SGLang's own argmax vs row_argmax over DSpark's verify logits (vocab 129280).

Arms: ``torch.argmax`` (what the op replaces for other targets), ``sglang-0.5.23`` (SGLang's
``_row_argmax(logits, fused=True)`` as DeepSeek-V4.1's verify calls it: its split-vocab kernel
where it admits the shape, inexact on NaN, else torch.argmax), ``triton`` (the multi-block
Triton kernel alone) and ``ours`` (the public op: on sm_90+ the CUDA kernels, clusters of CTAs
a row, and one CTA a row from 96 rows while the rows fit the GPU at once). Every arm is
checked equal to torch.argmax first (random rows, no NaN). ``--sweep`` also times the CUDA
kernels' launch shapes (:func:`sweep`), on logits full of ties.
    python benchmark/kernels/bench_row_argmax.py --json bench_row_argmax.json
"""

from __future__ import annotations

import torch
from common import parser, report, sglang_arm, sglang_function, timed

from dsv41_kernels.ops.speculative.argmax_reduction import cuda_module
from dsv41_kernels.ops.speculative.row_argmax import launch_triton, row_argmax, row_argmax_admission

VOCAB = 129280
SWEEP_SHAPES = ((128, 16), (256, 8), (256, 16), (512, 4), (512, 8), (1024, 2))
SWEEP_ROW_SHAPES = ((128, 8), (256, 4), (256, 8), (512, 2), (512, 4), (512, 8), (1024, 2))
SWEEP_ROW_SHAPES += ((1024, 4),)


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
    """The CUDA kernels' launch shapes, checked and timed: the cluster kernel's (threads x
    items) at 1, 6 and 64 rows, the one-CTA-a-row kernel's (threads x unroll) at 96..384."""
    records = []
    module = cuda_module(torch.device("cuda"))
    kernels = (
        ("cluster", module.row_argmax_cluster_shape, (1, 6, 64), SWEEP_SHAPES),
        ("rows", module.row_argmax_rows_shape, (96, 128, 256, 384), SWEEP_ROW_SHAPES),
    )
    for name, launch, row_counts, shapes in kernels:
        for rows in row_counts:
            x = torch.randn(rows, VOCAB, device="cuda")
            x[:, ::97] = x.max()  # ties everywhere
            ref = torch.argmax(x, dim=-1)
            out = torch.empty(rows, dtype=torch.int64, device="cuda")
            for threads, items in shapes:
                run = lambda x=x, t=threads, i=items, f=launch: f(x, out, t, i)
                run()
                shape = f"[{rows}, {VOCAB}] fp32, ties"
                arm = f"cuda {name} {threads}x{items}"
                records.append(timed("row_argmax", shape, arm, run, exact=torch.equal(out, ref)))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default="1,2,6,8,16,32,64,96,128,256,384")
    p.add_argument("--sweep", action="store_true", help="also time the CUDA launch shapes")
    args = p.parse_args()
    records = [r for rows in map(int, args.rows.split(",")) for r in measure(rows)]
    if args.sweep:
        records += sweep()
    report(records, args.json, baseline="torch.argmax")


if __name__ == "__main__":
    main()

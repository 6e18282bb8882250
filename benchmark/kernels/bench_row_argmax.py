"""torch.argmax and SGLang's own argmax vs row_argmax over DSpark's verify logits (vocab 129280).

Arms: ``torch.argmax`` (what the op replaces for other targets), ``sglang-0.5.23`` (SGLang's
``_row_argmax(logits, fused=True)`` as DeepSeek-V4.1's verify calls it: its split-vocab kernel
where it admits the shape, inexact on NaN, else torch.argmax), ``triton`` (the multi-block
Triton kernel alone) and ``ours`` (the public op: on sm_90+ the CUDA kernels, clusters of CTAs
a row, and one CTA a row from 96 rows while the rows fit the GPU at once; the record names the
kernel). Every arm is checked equal to torch.argmax first (random rows, no NaN). ``--sweep``
also times the CUDA kernels' other launch shapes (:mod:`row_argmax_variants`), on logits full
of ties.
    python benchmark/kernels/bench_row_argmax.py --json bench_row_argmax.json
"""

from __future__ import annotations

import torch
from common import parser, report, sglang_arm, sglang_function, timed
from row_argmax_variants import sweep

from dsv41_kernels.ops.speculative.argmax_plan import triton_launch
from dsv41_kernels.ops.speculative.row_argmax import launch_triton, row_argmax, row_argmax_admission

VOCAB = 129280


def measure(rows: int) -> list[dict]:
    x = torch.randn(rows, VOCAB, device="cuda")
    ref = torch.argmax(x, dim=-1)
    out = torch.empty(rows, dtype=torch.int64, device="cuda")
    shape = f"[{rows}, {VOCAB}] fp32"
    triton_shape = triton_launch(rows, VOCAB)
    arms = {
        "torch.argmax": lambda: torch.argmax(x, dim=-1, out=out),
        "triton": lambda: launch_triton(x, out, triton_shape),
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

"""SGLang's Q-side pair on Hopper vs the one-launch rmsnorm_quant_fp8.

DeepSeek-V4.1-Flash's ``q_lora`` (``[T, 1280]``, a view of ``wqkv_a``'s ``[T, 1792]`` output) at
verify rows T = 6, 24, 96, 384, and the 5120-wide hidden at T = 6. Arms: ``torch`` (the op's
fallback), ``sglang-0.5.23`` (what ``q_norm`` and ``wq_b`` run on SM90: FlashInfer's RMSNorm as
``sgl_kernel`` builds it, staged by ``tools/flashinfer_norm/stage.py``, then SGLang's own
``sglang_per_token_group_quant_fp8(y, 32, scale_ue8m0=True)``; two launches), ``sglang norm``
and ``sglang quant`` (each of the two alone: the longer one is the bar the fused launch should
meet), and ``ours``; checked bitwise against SGLang's pair first.

    python benchmark/kernels/bench_rmsnorm_quant_fp8.py --json bench_rmsnorm_quant_fp8.json
"""

from __future__ import annotations

import torch
from common import flashinfer_rmsnorm, parser, record, report, sglang_function, timed

from dsv41_kernels.ops.quantization.rmsnorm_quant_fp8 import (
    rmsnorm_quant_fp8,
    rmsnorm_quant_fp8_admission,
    rmsnorm_quant_fp8_torch,
)

SHAPES = ((6, 1280, 1792), (24, 1280, 1792), (96, 1280, 1792), (384, 1280, 1792), (6, 5120, 5120))
OP = "rmsnorm_quant_fp8"


def equal(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def measure(rows: int, d: int, width: int, norm, quant) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(rows)
    base = torch.randn(rows, width, device="cuda", generator=gen).bfloat16()
    x = base[:, :d]
    weight = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16()
    shape = f"[{rows}, {d}] bf16 (rows {width} apart), group 32"
    y = torch.empty(rows, d, dtype=torch.bfloat16, device="cuda")
    out = (
        torch.empty_like(y),
        torch.empty(rows, d, dtype=torch.float8_e4m3fn, device="cuda"),
        torch.empty(rows, d // 32, device="cuda"),
    )
    kernel = rmsnorm_quant_fp8_admission(x, weight, 1e-6, out=out).kernel
    ours = lambda: rmsnorm_quant_fp8(x, weight, 1e-6, out=out)
    records = []
    if norm is None or quant is None:
        why = "FlashInfer's norm headers not staged" if norm is None else "SGLang not importable"
        records.append(record(OP, shape, "sglang-0.5.23", None, error=why))
        exact = None
    else:
        sglang_norm = lambda: norm(x, weight, y, 1e-6)
        sglang_quant = lambda: quant(y, 32, scale_ue8m0=True)

        def pair():
            sglang_norm()
            return (y, *sglang_quant())

        exact = equal(ours(), pair())
        records += [
            timed(OP, shape, "sglang-0.5.23", pair, exact=exact),
            timed(OP, shape, "sglang norm", sglang_norm),
            timed(OP, shape, "sglang quant", sglang_quant),
        ]
    records += [
        timed(OP, shape, "torch", lambda: rmsnorm_quant_fp8_torch(x, weight, 1e-6, 32)),
        timed(OP, shape, "ours", ours, exact=exact, kernel=kernel),
    ]
    return records


def main() -> None:
    args = parser(__doc__).parse_args()
    norm = flashinfer_rmsnorm(torch.cuda.current_device())
    quant, _ = sglang_function(
        "sglang.kernels.ops.quantization.fp8_kernel", "sglang_per_token_group_quant_fp8"
    )
    records = [r for shape in SHAPES for r in measure(*shape, norm, quant)]
    report(records, args.json, baseline="torch")


if __name__ == "__main__":
    main()

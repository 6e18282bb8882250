"""mHC combine+RMSNorm then MXFP8 quantization: the two-launch pair vs the fused one-launch form.

DeepSeek-V4.1's hidden size (H = 5120), the decode/verify row counts m = 1, 6, 8, 64, 128
(DSpark verifies 6 rows per request), preallocated outputs. Arms, op ``hc_combine_norm_mxfp8``:
``sglang-0.5.23`` (SGLang's own fused ``hc_combine_norm_mxfp8``, which ``_combine`` calls when
the consumer takes swizzled MXFP8: Blackwell), ``unfused pair`` (``hc_combine_norm`` then
``mxfp8_quantize``, both ours), ``ours`` (``hc_combine_norm_mxfp8``: the CUDA cluster kernel on
sm_90+) and ``triton`` (the Triton kernel forced); op ``hc_combine_norm``: ``sglang-0.5.23``
(SGLang's fused combine+norm, what ``_combine`` runs on Hopper for 1-96 and 4096-65536 rows;
``benchmark/call_sites.py`` times ``_combine`` as dispatched at every row count) and ``ours``.
Op ``hc_combine_norm_quant_fp8``: the combine, then the FP8 groups an SM90 block-FP8 linear
quantizes its input into (``sglang_per_token_group_quant_fp8(y, 32, scale_ue8m0=True)``):
``sglang-0.5.23`` (SGLang's fused combine+norm, then its quantizer), ``unfused`` (ours, then
SGLang's quantizer) and ``ours`` (the groups in our launch, checked bit-equal to SGLang's
quantizer of our y).
SGLang's y is not bitwise ours (another reduction order): its records carry ``beyond_1ulp``,
the elements farther than one bf16 ulp from float64, as ours do. The fused outputs are checked
bit-equal to the pair first. Issue targets on the H200: ours at least 1.15x SGLang's
combine+norm at m = 6, <= 2.4 / 2.6 us at m = 64 / 128.
    python benchmark/kernels/bench_hc_combine_norm.py --json bench_hc_combine_norm.json

``--sweep`` also times the launch shapes of both kernels at m = 6, 64, 96, 128 and 192, each
checked first (:mod:`hc_combine_norm_variants`).
"""

from __future__ import annotations

import torch
from common import (
    groups_exact,
    parser,
    report,
    sglang_arm,
    sglang_group_quantizer,
    sglang_module,
    timed,
)
from hc_combine_norm_variants import EPS, shape_of, sweep

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.hc_combine_norm import (
    beyond_one_bf16_ulp,
    example_inputs,
    mxfp8_outputs,
    triton_plan,
)
from dsv41_kernels.ops.mhc.hc_combine_norm import (
    hc_combine_norm,
    hc_combine_norm_admission,
    hc_combine_norm_mxfp8,
    run_kernel,
)
from dsv41_kernels.ops.mhc.quant_out import empty_quant_out
from dsv41_kernels.ops.quantization.mxfp8_quantize import mxfp8_quantize
from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm as reference_hc_combine_norm

SGLANG_COMBINE = "sglang.kernels.ops.layernorm.hc_combine_norm"


def measure(m: int, h: int, device) -> list[dict]:
    x, pre, weight = example_inputs(m, h, device, seed=m)
    y = torch.empty(m, h, dtype=torch.bfloat16, device=device)
    fused_out = mxfp8_outputs(m, h, device)

    def pair():
        return y, mxfp8_quantize(hc_combine_norm(x, pre, weight, EPS, out=y))

    def fused():
        return hc_combine_norm_mxfp8(x, pre, weight, EPS, out=fused_out)

    def triton():
        run_kernel(x, pre, weight, EPS, *fused_out, triton_plan(quantized=fused_out[1]))
        return fused_out

    exact = bit_mismatches(fused(), pair()) == 0
    kernel = hc_combine_norm_admission(x, pre, weight, quantize=True).kernel
    shape = shape_of(m, h)
    op = "hc_combine_norm_mxfp8"
    y64 = reference_hc_combine_norm(x, pre, weight, EPS, dtype=torch.float64)
    ours_error = beyond_one_bf16_ulp(hc_combine_norm(x, pre, weight, EPS), y64)
    return sglang_records(x, pre, weight, y64, shape) + [
        timed(op, shape, "unfused pair", pair, exact=exact),
        timed(op, shape, "ours", fused, exact=exact, kernel=kernel),
        timed(op, shape, "triton", triton, exact=bit_mismatches(triton(), pair()) == 0),
        timed(
            "hc_combine_norm",
            shape,
            "ours",
            lambda: hc_combine_norm(x, pre, weight, EPS, out=y),
            kernel=kernel,
            beyond_1ulp=ours_error,
        ),
        *quant_records(x, pre, weight, y, shape, kernel),
    ]


def quant_records(x, pre, weight, y, shape, kernel) -> list[dict]:
    """Op ``hc_combine_norm_quant_fp8`` (the module says what each arm runs)."""
    op = "hc_combine_norm_quant_fp8"
    quantize, why = sglang_group_quantizer()
    kernels, why = (None, why) if quantize is None else sglang_module(SGLANG_COMBINE)
    sglang = None if kernels is None else kernels.hc_combine_norm
    if sglang is not None and x.shape[1] != 4 * 5120:
        sglang, why = None, "SGLang's fused combine takes H = 5120 only"
    quant_out = empty_quant_out(*y.shape, y.device)

    def ours():
        return hc_combine_norm(x, pre, weight, EPS, out=y, quant_out=quant_out)

    records = [sglang_arm(op, shape, sglang, why, lambda: quantize(sglang(x, pre, weight, EPS)))]
    if quantize is not None:
        exact = groups_exact(quant_out, quantize(ours()))
        records += [
            timed(op, shape, "unfused", lambda: quantize(hc_combine_norm(x, pre, weight, EPS))),
            timed(op, shape, "ours", ours, exact=exact, kernel=kernel),
        ]
    return records


def sglang_records(x, pre, weight, y64, shape) -> list[dict]:
    """SGLang's own fused kernels on the same input (H = 5120 only, as SGLang admits)."""
    kernels, why = sglang_module(SGLANG_COMBINE)
    if kernels is not None and x.shape[1] != 4 * 5120:
        kernels, why = None, "SGLang's fused combine takes H = 5120 only"
    records = []
    for op, name in (
        ("hc_combine_norm", "hc_combine_norm"),
        ("hc_combine_norm_mxfp8", "hc_combine_norm_mxfp8"),
    ):
        fn = None if kernels is None else getattr(kernels, name)
        if fn is not None and name.endswith("mxfp8") and x.shape[0] > 128:
            fn, why = None, "SGLang's MXFP8 form takes up to 128 rows"
        run = lambda fn=fn: fn(x, pre, weight, EPS)
        fields = {}
        if fn is not None:
            y = run()
            fields["beyond_1ulp"] = beyond_one_bf16_ulp(y if op == "hc_combine_norm" else y[0], y64)
        records.append(sglang_arm(op, shape, fn, why, run, **fields))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default="1,6,8,64,96,128,192")
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--sweep", action="store_true", help="also time the launch variants")
    args = p.parse_args()
    device = torch.device("cuda")
    records = [r for m in map(int, args.rows.split(",")) for r in measure(m, args.hidden, device)]
    if args.sweep:
        records += sweep(args.hidden, device)
    report(records, args.json, baseline="unfused pair")


if __name__ == "__main__":
    main()

"""``inverse_rope_quant_fp8`` against SGLang's chain on the attention output (Hopper).

DeepSeek-V4.1's output path per attention layer, at T = 6 / 24 / 96 / 384 tokens (6 per request
at verify) and G = 2 / 4 / 8 local output groups (TP 4 / 2 / 1: H = 8 G heads of 512, 64 rope),
``o`` as ``MQALayer.forward`` holds it: a slice of the 64-head padded buffer at TP > 1
(``padded``) or contiguous (``dense``: the layout without FlashMLA's padding). Arms:

- ``sglang-0.5.23``: SGLang's chain as it runs (deepseek_v4.py:2954-3016): its in-place
  ``fused_rope_inplace`` on ``o[..., -64:]``, the ``reshape(...).contiguous()`` (a copy when
  padded) and ``sglang_per_token_group_quant_fp8(..., 128, scale_ue8m0=False)``;
- ``sglang rope`` and ``sglang quant``: SGLang's two kernels alone (the quantizer on a
  contiguous input: its launch without the copy), for the goal "ours at T = 6 no longer than
  the longer of the two";
- ``ours``: ``inverse_rope_quant_fp8(..., rotate_o=True, tables_ready=True)``, what the
  plugin's hook on that path runs (the table read before the dependency wait, as SGLang's RoPE
  reads it); ``ours, tables after the wait``: the same without ``tables_ready``.

``exact``: ours equals SGLang's chain bit for bit on the same input (e4m3 values, fp32 scales,
rotated ``o``), checked before timing. ``ours`` records also carry ``saving_per_cycle_us``:
40 layers x (SGLang's chain - ours), one verify cycle's saving at that T. SGLang's kernels are
its tvm-ffi JIT builds (no ``sgl_kernel`` wheel): where SGLang does not import, its arms are
recorded with the error and ours is still timed and checked against the reference.
    python benchmark/kernels/bench_inverse_rope_quant_fp8.py --json bench_irq.json
"""

from __future__ import annotations

from common import SGLANG_ARM, parser, record, report, sglang_function, timed
from inverse_rope_quant_fp8_variants import OP, sweep

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.cases.inverse_rope_quant_fp8 import KERNEL_HEADS, attention_output, same_layout
from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import (
    inverse_rope_quant_fp8,
    inverse_rope_quant_fp8_admission,
)
from dsv41_kernels.reference.inverse_rope_quant_fp8 import (
    inverse_rope_quant_fp8 as reference_inverse_rope_quant_fp8,
)

LAYERS = 40
TABLES_AFTER_WAIT = "ours, tables after the wait"
"""Our op without ``tables_ready``: the position and the table read after the dependency wait."""


def sglang_chain(rope, quant, o, freqs_cis, positions, groups):
    rope(o[..., -64:], None, freqs_cis, positions=positions, inverse=True)
    grouped = o.view(o.shape[0], groups, -1)
    t, g, d = grouped.shape
    o_fp8, o_s = quant(grouped.reshape(t * g, d).contiguous(), group_size=128, scale_ue8m0=False)
    return o_fp8.view(t, g, d), o_s.view(t, g, -1)


def bench_call(tokens: int, groups: int, padded: bool):
    """One shape's inputs (H = 8 G heads, ``o`` padded to 64 heads or dense) and its label."""
    heads = 8 * groups
    call = attention_output(
        tokens, heads, o_groups=groups, seed=tokens * groups, device="cuda",
        kernel_heads=KERNEL_HEADS if padded else None,
    )  # fmt: skip
    return call, f"T {tokens}, G {groups} ({heads} x 512{' in 64' if padded else ''})"


def measure(tokens: int, groups: int, padded: bool) -> list[dict]:
    call, shape = bench_call(tokens, groups, padded)
    table, positions = call.freqs_cis, call.positions
    work = same_layout(call.o)
    ours = lambda: inverse_rope_quant_fp8(
        work, table, positions, o_groups=groups, rotate_o=True, tables_ready=True
    )
    mine = same_layout(call.o)
    got = inverse_rope_quant_fp8(
        mine, table, positions, o_groups=groups, rotate_o=True, tables_ready=True
    )
    kernel = inverse_rope_quant_fp8_admission(work, table, positions, o_groups=groups).kernel
    rope, why = sglang_function("sglang.kernels.ops.attention.dsv4.norm_rope", "fused_rope_inplace")
    quant, why_not = sglang_function(
        "sglang.kernels.ops.quantization.fp8_kernel", "sglang_per_token_group_quant_fp8"
    )
    if rope is None or quant is None:  # SGLang not importable here: ours against the reference
        codes, scales, rotated = reference_inverse_rope_quant_fp8(
            call.o, table, positions, o_groups=groups
        )
        exact = bit_mismatches((*got, mine), (codes, scales, rotated)) == 0
        error = why or why_not
        return [timed(OP, shape, "ours", ours, exact=exact, kernel=kernel, vs="reference")] + [
            record(OP, shape, arm, None, error=error)
            for arm in (SGLANG_ARM, "sglang rope", "sglang quant")
        ]
    theirs = same_layout(call.o)
    expected = sglang_chain(rope, quant, theirs, table, positions, groups)
    exact = bit_mismatches((*got, mine), (*expected, theirs)) == 0
    flat = work.view(tokens, groups, -1).reshape(tokens * groups, -1).contiguous()
    arms = {
        SGLANG_ARM: lambda: sglang_chain(rope, quant, work, table, positions, groups),
        "sglang rope": lambda: rope(
            work[..., -64:], None, table, positions=positions, inverse=True
        ),
        "sglang quant": lambda: quant(flat, group_size=128, scale_ue8m0=False),
    }
    records = [timed(OP, shape, arm, run) for arm, run in arms.items()]
    late_o = same_layout(call.o)
    late = inverse_rope_quant_fp8(late_o, table, positions, o_groups=groups, rotate_o=True)
    records.append(timed(
        OP, shape, TABLES_AFTER_WAIT,
        lambda: inverse_rope_quant_fp8(work, table, positions, o_groups=groups, rotate_o=True),
        exact=bit_mismatches((*late, late_o), (*expected, theirs)) == 0, kernel=kernel,
    ))  # fmt: skip
    mine = timed(OP, shape, "ours", ours, exact=exact, kernel=kernel, vs=SGLANG_ARM)
    chain = records[0]["us"]
    if chain is not None and mine["us"] is not None:
        mine["saving_per_cycle_us"] = LAYERS * (chain - mine["us"])
    return [*records, mine]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--tokens", default="6,24,96,384")
    p.add_argument("--groups", default="2,4,8")
    p.add_argument("--layouts", default="padded,dense", help="o at TP > 1: padded, dense")
    p.add_argument("--sweep", action="store_true", help="also time our kernel's launch shapes")
    args = p.parse_args()
    records = []
    for tokens in map(int, args.tokens.split(",")):
        for groups in map(int, args.groups.split(",")):
            for layout in args.layouts.split(","):
                if layout == "padded" and 8 * groups >= KERNEL_HEADS:
                    continue  # TP 1: every head is real, nothing is padded
                records += measure(tokens, groups, layout == "padded")
                if args.sweep:  # inverse_rope_quant_fp8_variants.py
                    records += sweep(*bench_call(tokens, groups, layout == "padded"))
    report(records, args.json, baseline=SGLANG_ARM)


if __name__ == "__main__":
    main()

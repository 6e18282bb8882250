"""Check cases of :func:`dsv41_kernels.ops.attention.inverse_rope_quant_fp8.inverse_rope_quant_fp8`,
and the attention outputs its tests and benchmark share."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import (
    inverse_rope_quant_fp8,
    inverse_rope_quant_fp8_admission,
)
from dsv41_kernels.reference.inverse_rope_quant_fp8 import (
    inverse_rope_quant_fp8 as reference_inverse_rope_quant_fp8,
)

# DeepSeek-V4.1 (docs/anchors.md): 64 heads of 448 nope + 64 rope, in 8 output groups.
OPS = ("inverse_rope_quant_fp8",)

HEAD_DIM = 512
ROPE_DIM = 64
KERNEL_HEADS = 64
"""Heads of the attention kernel's output at TP > 1 (FlashMLA pads to 64): ``o`` is a slice."""
MAX_BF16 = torch.finfo(torch.bfloat16).max


@dataclass
class AttentionOutput:
    """One call's inputs: ``o [T, H, head_dim]`` bf16 (a slice of a padded buffer, or not),
    the complex64 table and int32/int64 positions."""

    o: torch.Tensor
    freqs_cis: torch.Tensor
    positions: torch.Tensor
    o_groups: int

    def clone(self) -> AttentionOutput:
        """The same call on a copy of ``o`` in the same layout (for in-place comparisons)."""
        return AttentionOutput(same_layout(self.o), self.freqs_cis, self.positions, self.o_groups)


def same_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its strides (a slice of padded heads stays one)."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return copy.copy_(t)


def rope_table(rows: int, rope_dim: int = ROPE_DIM, *, gen: torch.Generator) -> torch.Tensor:
    """A complex64 ``[rows, rope_dim / 2]`` table of unit rotations, SGLang's ``freqs_cis``
    form (``torch.polar``), with exact rotations by 0 and by ±pi/2 in the first rows."""
    angles = torch.rand(rows, rope_dim // 2, generator=gen) * 2000.0
    table = torch.polar(torch.ones_like(angles), angles)
    exact = torch.tensor([1, 1j, -1j, -1], dtype=torch.complex64)
    table[: min(rows, 4)] = exact[: min(rows, 4), None]
    return table


def attention_output(
    tokens: int,
    heads: int,
    *,
    o_groups: int,
    seed: int,
    head_dim: int = HEAD_DIM,
    rope_dim: int = ROPE_DIM,
    kernel_heads: int | None = None,
    table_rows: int = 4096,
    freqs_cis: torch.Tensor | None = None,
    positions_dtype: torch.dtype = torch.int64,
    specials: bool = True,
    device: torch.device | str = "cpu",
) -> AttentionOutput:
    """Random attention output over five decades of magnitude (a spread of 2^±6 between
    groups), with special values in the first tokens (``specials``): NaN, ±Inf, ±0, the largest
    bf16 and bf16 subnormals, whole groups of NaN or of tiny values; ``kernel_heads`` puts
    ``o`` in a wider buffer as the attention kernel's padding does. The table is ``freqs_cis``
    when given (a layer's), else a random one of ``table_rows`` rows."""
    gen = torch.Generator().manual_seed(seed)
    kernel_heads = kernel_heads or heads
    decade = 10.0 ** torch.randint(-2, 3, (tokens, 1, 1), generator=gen).float()
    spread = torch.pow(2.0, torch.randint(-6, 7, (tokens, kernel_heads, 1), generator=gen).float())
    values = torch.randn(tokens, kernel_heads, head_dim, generator=gen) * decade * spread
    if specials and tokens:
        region = values[: max(1, tokens // 3), :heads].clone()
        _plant_specials(region, gen)
        values[: region.shape[0], :heads] = region
    o = values.to(torch.bfloat16).to(device)[:, :heads]
    table = rope_table(table_rows, rope_dim, gen=gen) if freqs_cis is None else freqs_cis
    positions = torch.randint(0, table.shape[0], (tokens,), generator=gen, dtype=positions_dtype)
    positions[: min(tokens, 4)] = torch.arange(min(tokens, 4), dtype=positions_dtype)
    return AttentionOutput(o, table.to(device), positions.to(device), o_groups)


def _plant_specials(values: torch.Tensor, gen: torch.Generator) -> None:
    """Special values in place in contiguous ``values [t, H, head_dim]`` (fp32, rounded to bf16
    later)."""
    flat = values.reshape(-1)
    n = flat.numel()
    picks = torch.randint(0, n, (6, max(1, n // 97)), generator=gen)
    flat[picks[0]] = float("nan")
    flat[picks[1]] = float("inf")
    flat[picks[2]] = float("-inf")
    flat[picks[3]] = -0.0
    flat[picks[4]] = MAX_BF16 * torch.sign(torch.randn(picks.shape[1], generator=gen))
    flat[picks[5]] = 2.0**-130  # a bf16 subnormal
    if values.numel() % 128 or values.numel() < 8 * 128:
        return
    rows = values.view(-1, 128)  # whole 128-value runs: groups, or parts of groups above 128
    rows[1] = float("nan")  # all NaN: the floor sets the scale
    rows[3] = 1e-12  # below the 1e-10 floor
    rows[5] = 0.0
    rows[7, ::2] = 2.0**127  # amax above 2^126: the multiplier flushes to 0


def check_cases(device: torch.device, small: bool) -> list[CheckCase]:
    if small:
        shapes = [(3, 4, 2, None), (5, 8, 2, 16)]  # tokens, heads, o_groups, kernel heads
    else:
        shapes = [(6, 16, 2, KERNEL_HEADS), (24, 32, 4, KERNEL_HEADS), (96, 64, 8, None)]
    cases = []
    for tokens, heads, groups, kernel_heads in shapes:
        call = attention_output(
            tokens, heads, o_groups=groups, seed=tokens * heads, kernel_heads=kernel_heads,
            device=device,
        )  # fmt: skip
        layout = f" in {kernel_heads} heads" if kernel_heads else ""
        cases.append(
            CheckCase(
                op="inverse_rope_quant_fp8",
                shape=f"o [{tokens}, {heads}, {HEAD_DIM}]{layout}, G = {groups}",
                admission=inverse_rope_quant_fp8_admission(
                    call.o, call.freqs_cis, call.positions, o_groups=groups
                ),
                run=lambda c=call: inverse_rope_quant_fp8(
                    c.o, c.freqs_cis, c.positions, o_groups=c.o_groups
                ),
                reference=lambda c=call: reference_inverse_rope_quant_fp8(
                    c.o, c.freqs_cis, c.positions, o_groups=c.o_groups
                )[:2],
                mismatches=bit_mismatches,
                # SGLang's chain is the baseline: benchmark/kernels/bench_inverse_rope_quant_fp8.py
            )
        )
    return cases

"""Inverse RoPE + FP8 group quantization: the reference against hand-worked values and exact
arithmetic, the Triton kernel against the reference bit for bit (the interpreter on CPU, the
GPU in the gpu tier), the CUDA kernel's admission on CPU and its bits in the gpu tier. The
comparison with SGLang's own two kernels is ``test/sglang``'s."""

import itertools
from fractions import Fraction

import pytest
import torch

from dsv41_kernels import interpreter
from dsv41_kernels.admission import admit
from dsv41_kernels.cases.inverse_rope_quant_fp8 import (
    HEAD_DIM,
    KERNEL_HEADS,
    MAX_BF16,
    AttentionOutput,
    attention_output,
    check_cases,
    rope_table,
)
from dsv41_kernels.ops.attention import inverse_rope_quant_fp8 as op
from dsv41_kernels.ops.attention.inverse_rope_quant_fp8 import (
    CUDA,
    TRITON,
    InverseRopeQuantKernel,
    InverseRopeQuantPlan,
    _cuda_fits,
    cuda_plan,
    inverse_rope_quant_fp8,
    inverse_rope_quant_fp8_admission,
    launch_cuda,
    triton_plan,
)
from dsv41_kernels.reference.inverse_rope_quant_fp8 import (
    AMAX_FLOOR_BITS,
    RCP_448_BITS,
    RCP_APPROX_STEPS,
    fma_f32,
    group_quant_fp8,
    inverse_rope,
    rcp_approx_ftz,
    round_to_bf16,
)
from dsv41_kernels.reference.inverse_rope_quant_fp8 import inverse_rope_quant_fp8 as reference
from dsv41_kernels.reference.mxfp8_quantize import e4m3_rne_satfinite
from test.machine import needs_kernel

# inf * 0 and NaN arithmetic are part of the contract; numpy (the interpreter) warns about them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NAN, INF = float("nan"), float("inf")


def f32(bits: int) -> float:
    return torch.tensor(bits, dtype=torch.int32).view(torch.float32).item()


def mul32(a: float, b: float) -> float:
    """``a * b`` rounded to fp32."""
    return (torch.tensor(a, dtype=torch.float32) * torch.tensor(b, dtype=torch.float32)).item()


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def forced(kernel: str, o: torch.Tensor, group_size: int = 128):
    """An admission of ``kernel`` (``cuda`` or ``triton``) at its default launch shape."""
    plan = cuda_plan(o) if kernel == CUDA else triton_plan(o, group_size)
    return admit(kernel, "forced by the test", plan=plan)


def run_both(call: AttentionOutput, *, group_size=128, rotate_o=True, kernel=None):
    """(ours, the reference's) on the same inputs: (codes, scales, o after the call);
    ``kernel``: the kernel forced (``cuda`` or ``triton``), else the admission's."""
    ours = call.clone()
    admission = None if kernel is None else forced(kernel, ours.o, group_size)
    codes, scales = inverse_rope_quant_fp8(
        ours.o, ours.freqs_cis, ours.positions, o_groups=call.o_groups,
        group_size=group_size, rotate_o=rotate_o, admission=admission,
    )  # fmt: skip
    ref_codes, ref_scales, rotated = reference(
        call.o, call.freqs_cis, call.positions, o_groups=call.o_groups, group_size=group_size
    )
    return (codes, scales, ours.o), (ref_codes, ref_scales, rotated if rotate_o else call.o)


def assert_bitwise(ours, ref):
    for name, a, b in zip(("o_fp8", "o_scales", "o"), ours, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        bad = bits_of(a) != bits_of(b)
        assert not bad.any(), f"{name}: {int(bad.sum())} of {a.numel()} differ"


# ---- the reference ------------------------------------------------------------------------------


def test_fma_rounds_once():
    gen = torch.Generator().manual_seed(0)
    n = 3000
    a = torch.randn(n, generator=gen) * torch.pow(2.0, torch.randint(-60, 60, (n,), generator=gen))
    b = torch.randn(n, generator=gen)
    c = -a * b * (1 + torch.randn(n, generator=gen) * 2.0**-20)  # near cancellation
    c[::3] = torch.randn(n // 3, generator=gen)
    got = fma_f32(a, b, c)
    for x, y, z, r in zip(a.tolist(), b.tolist(), c.tolist(), got.tolist(), strict=True):
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        nearest = torch.tensor(float(exact), dtype=torch.float64).float()
        # RN to fp32 of the exact value: the float64 rounding of ``exact`` can only mislead
        # at an fp32 tie, which the neighbours decide.
        candidates = torch.stack([torch.nextafter(nearest, torch.tensor(-INF)), nearest,
                                  torch.nextafter(nearest, torch.tensor(INF))])  # fmt: skip
        errors = [abs(Fraction(v) - exact) for v in candidates.tolist()]
        best = min(errors)
        ties = [v for v, e in zip(candidates.tolist(), errors, strict=True) if e == best]
        even = [v for v in ties if f32_bits(v) % 2 == 0]
        assert r == (even or ties)[0], (x, y, z)
    # Specials follow IEEE: Inf * 0 is NaN, Inf survives, the exact zero is +0.
    specials = fma_f32(torch.tensor([INF, 1.0, 2.0]), torch.tensor([0.0, INF, 3.0]),
                       torch.tensor([1.0, -1.0, -6.0]))  # fmt: skip
    assert torch.isnan(specials[0]) and specials[1] == INF
    assert specials[2] == 0 and not torch.signbit(specials[2])


def f32_bits(v: float) -> int:
    return torch.tensor(v, dtype=torch.float32).view(torch.int32).item()


def test_bf16_rounding_ties_to_even_and_canonical_nan():
    v = torch.tensor([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 3.4e38, NAN, -NAN, -0.0])
    assert bits_of(round_to_bf16(v)).tolist() == [
        0x3F80, 0x3F82, -0x4080, 0x7F80, 0x7FFF, 0x7FFF, -0x8000,
    ]  # fmt: skip


def test_inverse_rope_by_hand():
    # Rows 0..3 of the table rotate by 1, i, -i, -1: the inverse multiplies by the conjugate.
    table = rope_table(4, rope_dim=4, gen=torch.Generator().manual_seed(0))
    x = torch.tensor([[1.5, -2.0, 3.0, 0.25]]).repeat(4, 1)
    o = torch.cat([torch.full((4, 4), 7.0), x], dim=1)[:, None].to(torch.bfloat16)
    got = inverse_rope(o, table, torch.arange(4)).float()[:, 0]
    assert (got[:, :4] == 7.0).all()  # the nope values stay
    assert got[0, 4:].tolist() == [1.5, -2.0, 3.0, 0.25]  # by 1
    assert got[1, 4:].tolist() == [-2.0, -1.5, 0.25, -3.0]  # (a + bi)(-i) = b - ai
    assert got[2, 4:].tolist() == [2.0, 1.5, -0.25, 3.0]  # (a + bi)(i) = -b + ai
    assert got[3, 4:].tolist() == [-1.5, 2.0, -3.0, -0.25]


def test_inverse_rope_is_the_conjugate_rotation():
    call = attention_output(8, 4, o_groups=2, seed=1, specials=False)
    got = inverse_rope(call.o, call.freqs_cis, call.positions)[..., -64:].double()
    pairs = call.o[..., -64:].double().unflatten(-1, (-1, 2)).contiguous()
    z = torch.view_as_complex(pairs) * call.freqs_cis[call.positions][:, None].conj()
    error = (got.unflatten(-1, (-1, 2)) - torch.view_as_real(z)).abs().amax(-1)
    assert (error <= 2.0**-8 * z.abs()).all()  # a bf16 rounding of a value of that size


def test_position_outside_the_table_gives_nan():
    call = attention_output(3, 2, o_groups=1, seed=2, table_rows=8, specials=False)
    call.positions[1] = 8
    call.positions[2] = -1
    rotated = inverse_rope(call.o, call.freqs_cis, call.positions)
    assert not torch.isnan(rotated[0]).any()
    assert torch.isnan(rotated[1:, :, -64:]).all() and not torch.isnan(rotated[1:, :, :-64]).any()


def quantize_group(values):
    """One group of 128 by the reference -> (scale, codes)."""
    x = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)[None]
    codes, scales = group_quant_fp8(x, 128)
    return scales.item(), codes.view(torch.int8)[0].tolist()


def fill(value, **at):
    values = [value] * 128
    for index, v in at.items():
        values[int(index[1:])] = v
    return values


def test_quant_constants():
    assert f32(AMAX_FLOOR_BITS) == torch.tensor(1e-10, dtype=torch.float32).item()
    assert f32(RCP_448_BITS) == torch.tensor(1 / 448, dtype=torch.float32).item()


def test_quant_power_of_two_amax_is_an_exact_multiplier():
    # amax = 2^k: rcp is exact, the multiplier 448 / 2^k too, so the codes are e4m3(448 x / 2^k).
    gen = torch.Generator().manual_seed(3)
    for k in (-20, -1, 0, 3, 8, 100, 126):
        x = (torch.rand(127, generator=gen) * 2 - 1) * 2.0**k
        values = [2.0**k] + x.to(torch.bfloat16).float().tolist()
        scale, codes = quantize_group(values)
        assert scale == 2.0**k * f32(RCP_448_BITS)
        expected = e4m3_rne_satfinite(torch.tensor(values) * (448 * 2.0**-k)).view(torch.int8)
        assert codes == expected.tolist(), k


SPECIAL_GROUPS = [
    # (name, group, scale, {position: code} or the full list of codes)
    ("all +-0: the floor", [0.0, -0.0] * 64, mul32(f32(AMAX_FLOOR_BITS), f32(RCP_448_BITS)),
     [0x00, -0x80] * 64),
    ("below the floor: 1e-12 * 448 / 1e-10 = 4.48", fill(1e-12),
     mul32(f32(AMAX_FLOOR_BITS), f32(RCP_448_BITS)), {0: 0x49}),
    ("amax 448", fill(1.0, i0=448.0, i1=-448.0), mul32(448.0, f32(RCP_448_BITS)),
     {0: 0x7E, 1: -0x02, 2: 0x38}),
    ("NaN is ignored by amax, stays NaN", fill(1.0, i0=NAN, i1=256.0), 256 * f32(RCP_448_BITS),
     {0: 0x7F, 1: 0x7E, 2: 0x3E}),
    ("all NaN", [NAN] * 128, mul32(f32(AMAX_FLOOR_BITS), f32(RCP_448_BITS)), [0x7F] * 128),
    ("+Inf: multiplier 0", fill(1.0, i0=INF, i1=-INF, i2=-1.0), INF,
     {0: 0x7F, 1: 0x7F, 2: -0x80, 3: 0x00}),
    ("amax above 2^126: multiplier flushed", fill(-1.0, i0=2.0**127), 2.0**127 * f32(RCP_448_BITS),
     {0: 0x00, 1: -0x80}),
    ("largest bf16", fill(1.0, i5=-MAX_BF16), mul32(MAX_BF16, f32(RCP_448_BITS)),
     {5: -0x80, 0: 0x00}),
    ("amax exactly 2^126: not flushed", fill(2.0**125, i0=2.0**126), 2.0**126 * f32(RCP_448_BITS),
     {0: 0x7E, 1: 0x76}),
    ("bf16 subnormals next to a normal amax", fill(2.0**-130, i0=1.0), f32(RCP_448_BITS),
     {0: 0x7E, 1: 0x00}),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, group, scale, codes", SPECIAL_GROUPS, ids=[g[0] for g in SPECIAL_GROUPS]
)
def test_quant_special_values(name, group, scale, codes):
    got_scale, got_codes = quantize_group(group)
    assert got_scale == scale or (got_scale != got_scale and scale != scale)
    if isinstance(codes, dict):
        assert {i: got_codes[i] for i in codes} == codes
    else:
        assert got_codes == codes


# ---- the kernel ---------------------------------------------------------------------------------

# (tokens, heads, o_groups, kernel heads (padding), head_dim, rope_dim, group_size)
KERNEL_SHAPES = [
    (1, 2, 1, None, 512, 64, 128),
    (3, 4, 2, 8, 512, 64, 128),  # o a slice of a padded head buffer
    (2, 8, 8, None, 512, 64, 128),
    (4, 3, 3, None, 256, 64, 64),
    (2, 2, 1, 3, 128, 128, 32),  # rope over the whole head, in four groups
    (3, 2, 2, None, 64, 16, 16),
    (2, 4, 1, None, 512, 64, 256),
]


@needs_kernel
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("positions_dtype", [torch.int64, torch.int32])
def test_kernel_matches_reference(shape, positions_dtype):
    tokens, heads, groups, kernel_heads, head_dim, rope_dim, group_size = shape
    call = attention_output(
        tokens, heads, o_groups=groups, seed=tokens * heads * head_dim, kernel_heads=kernel_heads,
        head_dim=head_dim, rope_dim=rope_dim, table_rows=64, positions_dtype=positions_dtype,
    )  # fmt: skip
    assert inverse_rope_quant_fp8_admission(
        call.o, call.freqs_cis, call.positions, o_groups=groups, group_size=group_size
    )
    assert_bitwise(*run_both(call, group_size=group_size))


@needs_kernel
def test_kernel_matches_reference_on_many_random_calls():
    gen = torch.Generator().manual_seed(4)
    calls = 0
    for seed in range(150):
        tokens = int(torch.randint(1, 5, (), generator=gen))
        heads = int(torch.randint(1, 5, (), generator=gen))
        padding = int(torch.randint(0, 3, (), generator=gen))
        call = attention_output(
            tokens, heads, o_groups=1, seed=1000 + seed, head_dim=128, rope_dim=32,
            kernel_heads=heads + padding, table_rows=16, specials=seed % 2 == 0,
        )  # fmt: skip
        if seed % 5 == 0:
            call.positions[0] = 16 + seed  # past the table: NaN, never a stray read
        assert_bitwise(*run_both(call, group_size=32, rotate_o=seed % 3 != 0))
        calls += 1
    assert calls == 150


@needs_kernel
def test_kernel_on_every_bf16_value_up_to_256():
    # A 256 at the front of every group makes the multiplier 448 / 256 = 1.75 exactly, so every
    # code is the e4m3 rounding of 1.75 x: ties and subnormal bf16 included.
    values = torch.arange(0, 0x4381, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    values = torch.cat([values.float(), -values.float()])
    values = torch.cat([values, torch.zeros(-values.numel() % (4 * 127))]).reshape(-1, 127)
    groups = torch.cat([torch.full((values.shape[0], 1), 256.0), values], dim=1)
    o = groups.reshape(-1, 1, 512).to(torch.bfloat16)  # one head of 4 groups per token
    identity = torch.ones(1, 32, dtype=torch.complex64)
    positions = torch.zeros(o.shape[0], dtype=torch.int64)
    codes, scales = inverse_rope_quant_fp8(o, identity, positions, o_groups=1)
    assert (scales == 256 * f32(RCP_448_BITS)).all()
    # The identity rotation keeps every value but turns some -0 into +0 (fma(1, -0, +0) = +0).
    rotated = inverse_rope(o, identity, positions)
    expected = e4m3_rne_satfinite(rotated.float().reshape(codes.shape) * 1.75)
    assert torch.equal(bits_of(codes).view(torch.uint8), expected)


@needs_kernel
def test_kernel_into_callers_buffers_and_empty_input():
    call = attention_output(3, 4, o_groups=2, seed=5)
    out = (torch.empty(3, 2, 1024, dtype=torch.float8_e4m3fn), torch.empty(3, 2, 8))
    got = inverse_rope_quant_fp8(call.o, call.freqs_cis, call.positions, o_groups=2, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    ref_codes, ref_scales, _ = reference(call.o, call.freqs_cis, call.positions, o_groups=2)
    assert torch.equal(bits_of(out[0]), bits_of(ref_codes)) and torch.equal(out[1], ref_scales)
    empty = attention_output(0, 4, o_groups=2, seed=6)
    codes, scales = inverse_rope_quant_fp8(empty.o, empty.freqs_cis, empty.positions, o_groups=2)
    assert codes.shape == (0, 2, 1024) and scales.shape == (0, 2, 8)


def test_fallback_paths_match_reference(monkeypatch):
    call = attention_output(3, 4, o_groups=2, seed=7, kernel_heads=6)
    # Values two apart (stride 2 in the last dimension): the kernel's pairs are not words.
    wide = torch.zeros(3, 4, 2 * HEAD_DIM, dtype=torch.bfloat16)
    wide[..., ::2] = call.o
    strided = AttentionOutput(wide[..., ::2], call.freqs_cis, call.positions, 2)
    assert not inverse_rope_quant_fp8_admission(
        strided.o, strided.freqs_cis, strided.positions, o_groups=2
    )
    assert_bitwise(*run_both(strided))
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    if not call.o.is_cuda:
        assert not inverse_rope_quant_fp8_admission(
            call.o, call.freqs_cis, call.positions, o_groups=2
        )
    assert_bitwise(*run_both(call))
    assert_bitwise(*run_both(call, rotate_o=False))


def test_cuda_kernel_admission_names_what_it_needs(monkeypatch):
    """Which calls the CUDA kernel takes (its host side's checks, made before the launch), on
    CPU tensors with an sm_90 capability stood in. On a GPU a call it refuses takes the Triton
    kernel, the admission's reason naming why."""
    monkeypatch.setattr(op, "device_capability", lambda index: (9, 0))
    call = attention_output(3, 4, o_groups=2, seed=7, kernel_heads=6)
    o, table = call.o, call.freqs_cis
    assert _cuda_fits(o, table, 128) is None
    odd_heads = torch.zeros(3, 4 * HEAD_DIM + 2, dtype=torch.bfloat16)[:, 2:].view(3, 4, HEAD_DIM)
    wide_table = torch.zeros(table.shape[0], 2 * table.shape[1], dtype=torch.complex64)
    refusals = {
        "group_size 128": (o, table, 64),
        "8-byte words": (odd_heads, table, 128),
        "16-byte rows": (o, wide_table[:, ::2], 128),
        "too many groups": (torch.zeros(1, 1, 128, dtype=torch.bfloat16).expand(1, 65536, 128),
                            table, 128),
    }  # fmt: skip
    for expected, (o_, table_, group_size) in refusals.items():
        assert expected in _cuda_fits(o_, table_, group_size)
    monkeypatch.setattr(op, "device_capability", lambda index: (8, 9))
    assert "sm_90+" in _cuda_fits(o, table, 128)
    admission = inverse_rope_quant_fp8_admission(o, table, call.positions, o_groups=2)
    if not o.is_cuda and interpreter.RUNS_IN_INTERPRETER:
        assert admission.kernel == TRITON and "no CUDA device" in admission.reason


def test_admission_carries_the_launch_shape(monkeypatch):
    """The plan the launcher runs: Triton, 1024 values a program (fewer groups when a token has
    fewer), four warps; CUDA (an sm_90 device and its module stood in), four warps a CTA and a
    group a warp while the grid is one wave, two beyond."""
    call = attention_output(3, 4, o_groups=2, seed=7, kernel_heads=6)
    o, table, positions = call.o, call.freqs_cis, call.positions
    admission = inverse_rope_quant_fp8_admission(o, table, positions, o_groups=2)
    if not o.is_cuda and interpreter.RUNS_IN_INTERPRETER:
        assert admission.kernel == TRITON
        assert admission.plan == InverseRopeQuantPlan(InverseRopeQuantKernel.TRITON, 4, 8)
    assert triton_plan(o, 64).groups == 16 and triton_plan(o[:, :1, :128], 32).groups == 4
    monkeypatch.setattr(op, "one_wave", lambda programs, warps, device: programs <= 64)
    assert cuda_plan(o) == InverseRopeQuantPlan(InverseRopeQuantKernel.CUDA, 4, 1)
    assert cuda_plan(o[:, :1]) == InverseRopeQuantPlan(InverseRopeQuantKernel.CUDA, 4, 1)
    wide = attention_output(24, 4, o_groups=2, seed=7).o  # 384 groups: past one wave
    assert cuda_plan(wide) == InverseRopeQuantPlan(InverseRopeQuantKernel.CUDA, 4, 2)


def test_check_cases_are_exact():
    for case in check_cases(torch.device("cpu"), small=True):
        assert case.mismatches(case.run(), case.reference()) == 0, case.shape


def bad_calls():
    call = attention_output(2, 4, o_groups=2, seed=8)
    o, table, positions = call.o, call.freqs_cis, call.positions
    out = (torch.empty(2, 2, 1024, dtype=torch.float8_e4m3fn), torch.empty(2, 2, 8))
    odd = torch.empty(1 + 2 * 2 * 1024, dtype=torch.float8_e4m3fn)[1:].view(2, 2, 1024)
    return [
        (dict(o=o.float()), "o must have dtype"),
        (dict(o=o[0]), "o must be 3-D"),
        (dict(o=[1.0]), "o must be a torch.Tensor"),
        (dict(freqs_cis=table.real.contiguous()), "freqs_cis must have dtype"),
        (dict(freqs_cis=table[:0]), "freqs_cis must have at least one row"),
        (dict(freqs_cis=torch.ones(4, 300, dtype=torch.complex64)), "freqs_cis.shape"),
        (dict(positions=positions.float()), "positions must have dtype"),
        (dict(positions=positions[:1]), "positions must have o.shape"),
        (dict(o_groups=3), "o_groups must be a positive divisor"),
        (dict(o_groups=0), "o_groups must be a positive divisor"),
        (dict(group_size=96), "group_size must be one of"),
        (dict(o=o[..., :448].contiguous(), group_size=256), r"o.shape\[2\]"),
        (dict(out=out[0]), "out must be a pair"),
        (dict(out=(out[0][:1], out[1])), r"out\[0\] must be a contiguous"),
        (dict(out=(out[0], out[1].double())), r"out\[1\] must have dtype"),
        (dict(out=(odd, out[1])), r"out\[0\] must start 4-byte aligned"),
        (dict(freqs_cis=table.conj()), "lazily conjugated"),
        (dict(o=o[:, :0]), "o_groups must be a positive divisor"),
    ]


@pytest.mark.parametrize("index", range(len(bad_calls())))
def test_bad_input_raises_value_error_naming_the_argument(index):
    call = attention_output(2, 4, o_groups=2, seed=8)
    args = dict(o=call.o, freqs_cis=call.freqs_cis, positions=call.positions, o_groups=2)
    change, message = bad_calls()[index]
    args.update(change)
    o, table, positions = args.pop("o"), args.pop("freqs_cis"), args.pop("positions")
    with pytest.raises(ValueError, match=message):
        inverse_rope_quant_fp8(o, table, positions, **args)
    verdict = inverse_rope_quant_fp8_admission(o, table, positions, **args)
    assert not verdict and verdict.reason.startswith("invalid arguments")


# ---- one rule on every path: empty input, scalars, outputs, the admission --------------------


@pytest.mark.parametrize("rotate_o", [False, True])
def test_no_tokens_give_empty_outputs_on_every_path(path, rotate_o):
    """Zero tokens: the outputs' shapes and dtypes as for any other count, from the kernel's
    path, the fallback and the reference alike."""
    call = attention_output(0, 4, o_groups=2, seed=6)
    codes, scales = inverse_rope_quant_fp8(
        call.o, call.freqs_cis, call.positions, o_groups=2, group_size=64, rotate_o=rotate_o
    )
    assert codes.shape == (0, 2, 1024) and codes.dtype == torch.float8_e4m3fn
    assert scales.shape == (0, 2, 16) and scales.dtype == torch.float32
    ref_codes, ref_scales, rotated = reference(
        call.o, call.freqs_cis, call.positions, o_groups=2, group_size=64
    )
    assert (ref_codes.shape, ref_codes.dtype) == (codes.shape, codes.dtype)
    assert (ref_scales.shape, ref_scales.dtype) == (scales.shape, scales.dtype)
    assert rotated.shape == call.o.shape and rotated.dtype == torch.bfloat16


def _bad_scalars():
    return [
        (dict(group_size=128.0), "^group_size must be an int"),
        (dict(group_size=True), "^group_size must be an int, got the bool"),
        (dict(group_size="32"), "^group_size must be an int"),
        (dict(o_groups=True), "^o_groups must be an int, got the bool"),
        (dict(o_groups=2.0), "^o_groups must be an int"),
        (dict(rotate_o="no"), "^rotate_o must be a bool"),
        (dict(rotate_o=1), "^rotate_o must be a bool"),
        (dict(tables_ready="yes"), "^tables_ready must be a bool"),
        (dict(tables_ready=None), "^tables_ready must be a bool"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_scalars())))
@pytest.mark.parametrize("given", [False, True], ids=["own admission", "caller's admission"])
def test_scalars_are_checked_on_every_path(index, path, given):
    """The one scalar rule, with or without a caller's admission (an admitted one spares the
    tensor checks only); the admission refuses what the op refuses."""
    call = attention_output(2, 4, o_groups=2, seed=8)
    change, match = _bad_scalars()[index]
    kwargs = dict(o_groups=2, group_size=32) | change
    admission = None
    if given:
        admission = inverse_rope_quant_fp8_admission(
            call.o, call.freqs_cis, call.positions, o_groups=2, group_size=32
        )
        assert bool(admission) == (path == "kernel" or call.o.is_cuda)
    with pytest.raises(ValueError, match=match):
        inverse_rope_quant_fp8(
            call.o, call.freqs_cis, call.positions, **kwargs, admission=admission
        )
    if not set(change) & {"rotate_o", "tables_ready"}:
        verdict = inverse_rope_quant_fp8_admission(call.o, call.freqs_cis, call.positions, **kwargs)
        assert not verdict and verdict.reason.startswith("invalid arguments")


@needs_kernel
@pytest.mark.parametrize("given", [False, True], ids=["own admission", "caller's admission"])
def test_numpy_scalars_reach_the_kernel_as_python_ints(monkeypatch, given):
    """``group_size=np.int64(128)`` broke the interpreter: every path takes NumPy integers and
    the launcher gets Python ints."""
    import numpy as np

    seen = {}
    launch_triton = op.launch_triton
    monkeypatch.setattr(
        op, "launch_triton", lambda *a, **k: seen.update(k) or launch_triton(*a, **k)
    )
    call = attention_output(2, 4, o_groups=2, seed=8)
    admission = None
    if given:
        admission = forced(TRITON, call.o, group_size=32)
    codes, scales = inverse_rope_quant_fp8(
        call.o, call.freqs_cis, call.positions, o_groups=np.int64(2), group_size=np.int32(32),
        rotate_o=np.bool_(False), admission=admission,
    )  # fmt: skip
    ref_codes, ref_scales, _ = reference(
        call.o, call.freqs_cis, call.positions, o_groups=2, group_size=32
    )
    assert torch.equal(bits_of(codes), bits_of(ref_codes)) and torch.equal(scales, ref_scales)
    if seen:
        assert type(seen["group_size"]) is int and type(seen["rotate_o"]) is bool


def _overlapping_outputs():
    call = attention_output(2, 4, o_groups=2, seed=8)
    codes = torch.empty(2, 2, 1024, dtype=torch.float8_e4m3fn)
    in_codes = codes.view(torch.uint8).view(-1)[:128].view(torch.float32).view(2, 2, 8)
    heads = call.o[:, :1].expand(2, 4, HEAD_DIM)
    return call, [
        (dict(out=(codes, in_codes)), r"^out\[0\] and out\[1\] share memory"),
        (dict(o=heads, rotate_o=True), "^o has overlapping elements"),
    ]


@pytest.mark.parametrize("index", range(len(_overlapping_outputs()[1])))
def test_overlapping_outputs_are_refused_on_every_path(index, path):
    """Outputs the call writes (``out`` and, with ``rotate_o``, ``o``) must own their elements
    and not share them: the kernel would overwrite one with another."""
    call, cases = _overlapping_outputs()
    change, match = cases[index]
    args = dict(o=call.o, o_groups=2) | change
    with pytest.raises(ValueError, match=match):
        inverse_rope_quant_fp8(args.pop("o"), call.freqs_cis, call.positions, **args)


def test_expanded_o_is_read_when_not_rotated(path):
    """Without ``rotate_o``, ``o`` is only read: an expanded view is a valid input."""
    call = attention_output(2, 4, o_groups=2, seed=8)
    heads = call.o[:, :1].expand(2, 4, HEAD_DIM)
    codes, scales = inverse_rope_quant_fp8(heads, call.freqs_cis, call.positions, o_groups=2)
    ref_codes, ref_scales, _ = reference(heads, call.freqs_cis, call.positions, o_groups=2)
    assert torch.equal(bits_of(codes), bits_of(ref_codes)) and torch.equal(scales, ref_scales)


def test_admission_must_be_an_admission():
    call = attention_output(2, 4, o_groups=2, seed=8)
    with pytest.raises(TypeError, match="^admission must be an Admission"):
        inverse_rope_quant_fp8(
            call.o, call.freqs_cis, call.positions, o_groups=2, admission="kernel"
        )


def test_rcp_model_is_the_other_neighbour_where_it_steps():
    """The model of ``rcp.approx.ftz``: the correctly rounded reciprocal, except on the measured
    significands, where it is the other fp32 neighbour of the exact value (a faithful rounding,
    never further); the same at every exponent with a normal result, 0 above 2^126."""
    significands = 1 + torch.arange(128, dtype=torch.float32) / 128
    for exponent in (-126, -30, 0, 8, 125):
        amax = significands * 2.0**exponent
        model = rcp_approx_ftz(amax)
        for field, (a, r) in enumerate(zip(amax.tolist(), model.tolist(), strict=True)):
            nearest = torch.tensor(1.0) / torch.tensor(a)
            exact = 1 / Fraction(a)
            if field not in RCP_APPROX_STEPS:
                assert r == nearest.item(), (exponent, field)
                continue
            step = torch.tensor(r).view(torch.int32) - nearest.view(torch.int32)
            assert step.item() == RCP_APPROX_STEPS[field], (exponent, field)
            assert min(r, nearest.item()) < exact < max(r, nearest.item()), (exponent, field)
    flushed = rcp_approx_ftz(torch.tensor([2.0**126 * 1.0078125, 2.0**127, float("inf")]))
    assert flushed.tolist() == [0.0, 0.0, 0.0]
    assert rcp_approx_ftz(torch.tensor([1e-10])).item() == (torch.tensor(1.0) / 1e-10).item()


# ---- GPU tier -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [CUDA, TRITON])
def test_gpu_kernel_matches_reference(kernel):
    """DeepSeek-V4.1's shapes at TP 4 / 2 / 1 (H = 8 G heads), ``o`` a slice of the padded
    64-head buffer and dense, from one token to past one wave (two groups a CUDA warp), the
    rotated ``o`` written back or not, in turn."""
    calls = []
    for tokens in (1, 6, 24, 96, 384):
        for groups in (2, 4, 8):
            heads = 8 * groups  # TP 4 / 2 / 1 of DeepSeek-V4.1
            for padded in (False, True) if heads < KERNEL_HEADS else (False,):
                rotate_o = len(calls) % 2 == 0
                call = attention_output(
                    tokens, heads, o_groups=groups, seed=100 * tokens + 10 * groups + padded,
                    kernel_heads=KERNEL_HEADS if padded else None, device="cuda",
                )  # fmt: skip
                if kernel == CUDA:  # the default for SGLang's layouts on sm_90+
                    assert inverse_rope_quant_fp8_admission(
                        call.o, call.freqs_cis, call.positions, o_groups=groups
                    ).kernel == CUDA  # fmt: skip
                assert_bitwise(*run_both(call, rotate_o=rotate_o, kernel=kernel))
                calls.append((tokens, groups, padded, rotate_o))
    assert len(calls) == 25
    if kernel == CUDA:  # both launch shapes the plan chooses
        assert {cuda_plan(attention_output(t, 8 * g, o_groups=g, seed=0, device="cuda").o).groups
                for t, g in ((1, 2), (384, 8))} == {1, 2}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("positions_dtype", [torch.int64, torch.int32])
def test_gpu_cuda_kernel_on_its_edges(positions_dtype):
    """The CUDA kernel where its layout is tight: one head, rope over a whole group or past it
    (256 of 512), heads of 128, positions outside the table (int64 ones past 2^32 too), strided
    positions and table rows wider than the table, every launch shape (warps a CTA x groups a
    warp, groups past the token's last included), the table read before the wait or after."""
    calls = 0
    for tokens, heads, head_dim, rope_dim, padding in (
        (1, 1, 128, 64, 0), (5, 3, 512, 256, 1), (7, 2, 128, 128, 2), (2, 4, 256, 4, 0),
    ):  # fmt: skip
        for seed in range(4):
            call = attention_output(
                tokens, heads, o_groups=1, seed=seed * 31 + tokens, head_dim=head_dim,
                rope_dim=rope_dim, kernel_heads=heads + padding, table_rows=8,
                positions_dtype=positions_dtype, device="cuda",
            )  # fmt: skip
            far = 2**31 - 1 if positions_dtype == torch.int32 else 2**33
            call.positions[0] = (-1, 8, far, 0)[seed]  # outside the table: NaN
            if seed % 2:  # every other stride 2 apart, table rows two entries wider
                spread = torch.zeros(2 * tokens, dtype=positions_dtype, device="cuda")
                spread[::2] = call.positions
                wide = torch.zeros(8, rope_dim // 2 + 2, dtype=torch.complex64, device="cuda")
                wide[:, : rope_dim // 2] = call.freqs_cis
                call = AttentionOutput(call.o, wide[:, : rope_dim // 2], spread[::2], 1)
            assert _cuda_fits(call.o, call.freqs_cis, 128) is None
            want = run_both(call, kernel=CUDA)[1]
            for warps, groups, ready in itertools.product((1, 2, 4, 8), (1, 2, 4), (False, True)):
                ours = call.clone()
                codes = torch.empty_like(want[0])
                scales = torch.empty_like(want[1])
                launch_cuda(
                    ours.o, ours.freqs_cis, ours.positions, codes, scales, rotate_o=True,
                    tables_ready=ready, warps=warps, groups=groups,
                )  # fmt: skip
                assert_bitwise((codes, scales, ours.o), want)
                calls += 1
    assert calls == 384


@pytest.mark.gpu
def test_gpu_reciprocal_model_holds_on_every_amax():
    """The reference's ``rcp.approx.ftz.f32`` model (``rcp_approx_ftz``) against the GPU on
    every value ``amax`` can take: each bf16 significand (at exponents across the range) and
    fp32(1e-10). Were it to fail, the kernel still equals SGLang (same instruction) but the
    reference (and the CPU tier) would miss these values."""
    significands = 1 + torch.arange(128, dtype=torch.float32) / 128
    exponents = (-33, -30, -1, 0, 1, 8, 60, 125)
    amax = torch.cat([significands * 2.0**e for e in exponents] + [torch.tensor([1e-10])])
    hardware = _rcp_approx_ftz(amax.cuda()).cpu()
    model = rcp_approx_ftz(amax)
    differ = (hardware.view(torch.int32) != model.view(torch.int32)).nonzero().flatten()
    assert differ.numel() == 0, [
        (amax[i].item(), hex(hardware.view(torch.int32)[i].item())) for i in differ
    ]


def _rcp_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    import triton
    import triton.language as tl

    @triton.jit
    def rcp_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < n, other=1.0)
        y = tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
        tl.store(y_ptr + i, y, mask=i < n)

    y = torch.empty_like(x)
    rcp_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [CUDA, TRITON])
def test_gpu_graph_replay_follows_new_values(kernel):
    call = attention_output(24, 16, o_groups=2, seed=9, kernel_heads=KERNEL_HEADS, device="cuda")
    work = call.clone()
    out = (
        torch.empty(24, 2, 4096, dtype=torch.float8_e4m3fn, device="cuda"),
        torch.empty(24, 2, 32, device="cuda"),
    )

    admission = forced(kernel, work.o)

    def step():
        inverse_rope_quant_fp8(
            work.o, work.freqs_cis, work.positions, o_groups=2, rotate_o=True, out=out,
            admission=admission,
        )  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(3):
        new = attention_output(24, 16, o_groups=2, seed=50 + replay, kernel_heads=KERNEL_HEADS,
                               device="cuda")  # fmt: skip
        work.o.copy_(new.o)
        work.positions.copy_(new.positions)
        graph.replay()
        torch.cuda.synchronize()
        codes, scales, rotated = reference(new.o, work.freqs_cis, new.positions, o_groups=2)
        assert_bitwise((out[0], out[1], work.o), (codes, scales, rotated))

import warnings

import pytest
import torch

from dsv41_kernels import interpreter
from dsv41_kernels.admission import admit
from dsv41_kernels.cases.mxfp8_quantize import special_values_bf16
from dsv41_kernels.ops.quantization.mxfp8_quantize import (
    TRITON,
    Mxfp8QuantizePlan,
    _launch_shape,
    launch,
    mxfp8_quantize,
    mxfp8_quantize_admission,
)
from dsv41_kernels.reference.mxfp8_quantize import (
    e4m3_rne_satfinite,
    scale_buffer_size,
    swizzled_scale_offset,
)
from dsv41_kernels.reference.mxfp8_quantize import mxfp8_quantize as reference
from test.machine import needs_kernel

# inf * 0 and NaN arithmetic are part of the contract; numpy (the interpreter) warns about them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NAN, INF = float("nan"), float("inf")
MAX_BF16 = torch.finfo(torch.bfloat16).max
TINY = 448 * 2.0**-126  # the smallest amax with a non-zero scale on the cuda backend


def assert_same_bytes(ours, ref):
    (q, sf), (q_ref, sf_ref) = ours, ref
    assert q.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape
    assert sf.dtype == torch.uint8 and sf.shape == sf_ref.shape
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(sf, sf_ref)


def quantize_block(values, backend="cuda"):
    """One hand-built block of 32 -> (scale byte, list of e4m3 codes)."""
    x = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)[None, :]
    assert x.shape == (1, 32)
    q, sf = reference(x, swizzled=False, backend=backend)
    return int(sf[0]), q.view(torch.uint8)[0].tolist()


def fill(value, **at):
    values = [value] * 32
    for index, v in at.items():
        values[int(index[1:])] = v
    return values


# ---- the e4m3 rounding model ------------------------------------------------------------------


def e4m3_brute_force(t: float) -> int:
    """Nearest e4m3 value by search over all codes, ties to the even code, saturating."""
    if t != t:
        return 0x7F
    sign = 0x80 if (t < 0 or (t == 0 and str(t).startswith("-"))) else 0
    a = abs(t)
    if a >= 448:
        return sign | 0x7E
    codes = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    distance = (codes - a).abs()
    best = distance.min()
    tied = (distance == best).nonzero().flatten().tolist()
    code = tied[0] if len(tied) == 1 else next(c for c in tied if c % 2 == 0)
    return sign | code


def test_e4m3_model_matches_brute_force_over_all_codes():
    grid = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (grid[1:] + grid[:-1]) / 2  # exact in fp32: five significant bits at most
    probes = [
        grid,
        mids,
        torch.nextafter(mids, torch.tensor(INF)),
        torch.nextafter(mids, torch.tensor(0.0)),
    ]
    probes.append(torch.tensor([448.0, 456.0, 464.0, 464.00003, 470.0, 480.0, 1e30, 3e38, INF]))
    probes.append(torch.tensor([2.0**-10, 2.0**-11, 3 * 2.0**-11, 2.0**-126, 1e-45, 2.0**-9 * 7.5]))
    values = torch.cat(probes)
    values = torch.cat([values, -values, torch.tensor([NAN, 0.0, -0.0])])
    expected = [e4m3_brute_force(v) for v in values.tolist()]
    assert e4m3_rne_satfinite(values).tolist() == expected
    # The spec's named cases: ties at 464 go to 448, -0 keeps its sign, NaN -> 0x7F.
    assert e4m3_rne_satfinite(torch.tensor([464.0, -464.0, -0.0, NAN])).tolist() == [
        0x7E,
        0xFE,
        0x80,
        0x7F,
    ]


# ---- the reference on the special-value table (docs/specs.md B.3) ----------------------------

SPECIAL_BLOCKS = [
    # (name, block, scale byte, expected codes as {position: code} or a full list)
    ("all +-0", [0.0, -0.0] * 16, 0, [0x00, 0x80] * 16),
    ("normal data", fill(1.0, i31=-3.0), 120, {0: 0x70, 31: 0xFC}),  # osc 2^7
    ("amax exactly 448", fill(1.0, i0=448.0), 127, {0: 0x7E, 1: 0x38}),
    ("ties through osc = 1", fill(1.0625, i0=448.0, i1=1.1875), 127, {0: 0x7E, 1: 0x3A, 2: 0x38}),
    ("max bf16", fill(-2.5, i3=MAX_BF16), 247, {3: 0x78, 0: 0x80}),
    ("+-inf", fill(0.75, i4=INF, i9=-INF, i10=-1.0), 254, {4: 0x7E, 9: 0x7E, 0: 0x00, 10: 0x80}),
    ("NaN at even positions", fill(1.5, i2=NAN, i6=NAN), 119, {2: 0x7E, 6: 0x7E, 0: 0x7C}),
    ("NaN at some odd positions", fill(1.5, i1=NAN, i7=NAN), 119, {1: 0x7E, 7: 0x7E, 0: 0x7C}),
    ("all odd positions NaN", [1.0, NAN] * 16, 255, [0x7E] * 32),
    ("all even positions NaN", [NAN, 1.0] * 16, 119, [0x7E, 0x78] * 16),
    ("all NaN", [NAN] * 32, 255, [0x7E] * 32),
    ("amax below 448*2^-126", fill(2.0**-120, i5=-(2.0**-119)), 0, {0: 0x00, 5: 0x80}),
    ("amax exactly 448*2^-126", fill(2.0**-120, i0=TINY), 1, {0: 0x7E}),
    (
        "bf16 subnormals flushed",
        fill(2.0**-127, i0=TINY, i1=-(2.0**-128)),
        1,
        {0: 0x7E, 1: 0x80, 2: 0x00},
    ),
    ("between 448*2^-127 and 448*2^-126", fill(1.5 * 2.0**-118), 0, [0x00] * 32),
]


@pytest.mark.parametrize(
    "name, block, scale, codes", SPECIAL_BLOCKS, ids=[b[0] for b in SPECIAL_BLOCKS]
)
def test_reference_special_values(name, block, scale, codes):
    got_scale, got_codes = quantize_block(block)
    assert got_scale == scale
    if isinstance(codes, dict):
        assert {i: got_codes[i] for i in codes} == codes
    else:
        assert got_codes == codes


def test_reference_normal_data_matches_closed_form():
    # Away from the specials: e = 127 + ceil(log2(amax / 448)) and q = RNE(x * 2^(127 - e)).
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 32, generator=gen) * torch.logspace(-30, 30, 64)[:, None]).to(
        torch.bfloat16
    )
    q, sf = reference(x, swizzled=False)
    amax = x.double().abs().amax(1)
    e = 127 + torch.ceil(torch.log2(amax / 448)).long()
    assert torch.equal(sf.long(), e)
    expected = e4m3_rne_satfinite(
        (x.double() * torch.pow(2.0, (127 - e)[:, None].double())).float()
    )
    assert torch.equal(q.view(torch.uint8), expected)


def test_cute_dsl_backend_differs_only_on_degenerate_blocks():
    assert quantize_block([1.0, NAN] * 16, "cute-dsl") == (119, [0x78, 0x7E] * 16)
    assert quantize_block([NAN] * 32, "cute-dsl") == (254, [0x7E] * 32)
    # No flush to zero: the window below 448*2^-126 gets scale 1 (1.5*2^-118*2^126 = 384)...
    assert quantize_block(fill(1.5 * 2.0**-118), "cute-dsl") == (1, [0x7C] * 32)
    # ... and bf16 subnormals survive (2^-127 * 2^126 = 0.5, -2^-128 * 2^126 = -0.25).
    scale, codes = quantize_block(fill(2.0**-127, i0=TINY, i1=-(2.0**-128)), "cute-dsl")
    assert (scale, codes[:3]) == (1, [0x7E, 0xA8, 0x30])
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(16, 256, generator=gen) * 10).to(torch.bfloat16)
    assert_same_bytes(reference(x, backend="cute-dsl"), reference(x))


# ---- scale layouts --------------------------------------------------------------------------


def test_swizzled_offsets_by_hand():
    # 8 scale columns (K = 256): [rows/128, 2, 32, 4, 4].
    by_hand = {
        (0, 0): 0,
        (0, 1): 1,
        (0, 3): 3,
        (0, 4): 512,
        (1, 0): 16,
        (31, 0): 496,
        (32, 0): 4,
        (33, 2): 22,
        (127, 5): 1021,
        (128, 0): 1024,
        (130, 6): 1570,
    }
    for (row, col), offset in by_hand.items():
        assert swizzled_scale_offset(row, col, 8) == offset, (row, col)


def test_swizzled_layout_is_the_linear_one_rearranged_with_zero_padding():
    gen = torch.Generator().manual_seed(2)
    m, k = 130, 96  # two row tiles, 3 scale columns padded to 4
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16) * 1000
    q, sf = reference(x, swizzled=True)
    q_lin, sf_lin = reference(x, swizzled=False)
    assert torch.equal(q.view(torch.uint8), q_lin.view(torch.uint8))
    assert sf.numel() == scale_buffer_size(m, k, swizzled=True) == 256 * 4
    tiles = sf.view(2, 1, 32, 4, 4).transpose(1, 3).reshape(256, 4)
    assert torch.equal(tiles[:m, :3], sf_lin.view(m, 3))
    assert not tiles[m:].any() and not tiles[:, 3:].any()


# ---- the Triton kernel ------------------------------------------------------------------------


def kernel_inputs(m, k, *, seed, dtype=torch.bfloat16, row_stride=None):
    """Random blocks over a wide magnitude range with the special-value blocks in the first rows."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(2.0, torch.randint(-60, 60, (m, k // 32, 1), generator=gen).float())
    x = (torch.randn(m, k // 32, 32, generator=gen) * magnitude).reshape(m, k)
    if dtype == torch.bfloat16:
        specials = special_values_bf16(k)[:m]
        x[: specials.shape[0]] = specials.float()
    else:
        x = x.clamp(-60000, 60000)
    buffer = torch.zeros(m, row_stride or k, dtype=dtype)
    buffer[:, :k] = x.to(dtype)
    return buffer[:, :k]


@needs_kernel
@pytest.mark.parametrize(
    "m, k, row_stride, dtype",
    [
        (1, 32, None, torch.bfloat16),
        (6, 96, 160, torch.bfloat16),
        (130, 64, None, torch.bfloat16),
        (5, 64, 96, torch.float16),
    ],
)
@pytest.mark.parametrize("swizzled", [True, False])
def test_kernel_matches_reference(m, k, row_stride, dtype, swizzled):
    x = kernel_inputs(m, k, seed=m * k, dtype=dtype, row_stride=row_stride)
    assert mxfp8_quantize_admission(x, swizzled=swizzled)
    assert_same_bytes(mxfp8_quantize(x, swizzled=swizzled), reference(x, swizzled=swizzled))


@needs_kernel
def test_kernel_on_every_bf16_value_up_to_448():
    # A 448 in front of each block fixes the scale at 127 (osc = 1), so every code is the
    # e4m3 rounding of the bf16 value itself: ties included, subnormal bf16 flushed to +-0.
    bits = torch.arange(0, 0x7F80, dtype=torch.int32)
    values = bits.to(torch.int16).view(torch.bfloat16).float()
    values = values[values <= 448]
    values = torch.cat([values, -values])
    per_row = 31 * 32  # 32 blocks of 31 values per 1024-wide row
    values = torch.cat([values, torch.zeros(-values.numel() % per_row)]).reshape(-1, 31)
    blocks = torch.cat([torch.full((values.shape[0], 1), 448.0), values], dim=1)
    x = blocks.reshape(-1, 1024).to(torch.bfloat16)
    q, sf = mxfp8_quantize(x, swizzled=False)
    assert (sf == 127).all()
    flushed = torch.where(x.float().abs() < 2.0**-126, x.float() * 0, x.float())
    assert torch.equal(q.view(torch.uint8), e4m3_rne_satfinite(flushed))
    assert_same_bytes((q, sf), reference(x, swizzled=False))


@needs_kernel
def test_kernel_writes_every_scale_byte():
    x = kernel_inputs(5, 96, seed=3)
    q = torch.empty(5, 96, dtype=torch.float8_e4m3fn)
    scales = torch.full((scale_buffer_size(5, 96, swizzled=True),), 0xAB, dtype=torch.uint8)
    launch(mxfp8_quantize_admission(x).plan, x, q, scales)
    assert_same_bytes((q, scales), reference(x))


@needs_kernel
def test_admission_carries_the_launch_shape():
    """The plan the launcher runs: 32 blocks a program at most, scale columns padded to 4 when
    swizzled, one extra program zeroing a partial 128-row tile; nothing to launch when empty."""
    x = kernel_inputs(130, 96, seed=6)
    admission = mxfp8_quantize_admission(x)
    assert admission.kernel == TRITON
    assert admission.plan == Mxfp8QuantizePlan(True, 3, 4, 4, 1, 131)
    assert mxfp8_quantize_admission(x, swizzled=False).plan == Mxfp8QuantizePlan(
        False, 3, 3, 4, 1, 130
    )
    wide = mxfp8_quantize_admission(kernel_inputs(2, 40 * 32, seed=7)).plan
    assert (wide.block_cols, wide.col_programs, wide.programs) == (32, 2, 6)  # 2 zero the tile
    for shape in ((0, 64), (5, 0)):
        empty = torch.empty(shape, dtype=torch.bfloat16)
        assert mxfp8_quantize_admission(empty).plan.programs == 0
    # A caller's admission is the plan that runs: the call is not re-planned.
    ours = mxfp8_quantize(x, swizzled=False, admission=mxfp8_quantize_admission(x, swizzled=False))
    assert_same_bytes(ours, reference(x, swizzled=False))


def test_fallback_paths_match_reference(monkeypatch):
    x = kernel_inputs(4, 128, seed=4, row_stride=256)
    strided = kernel_inputs(4, 256, seed=5)[:, ::2]
    assert not mxfp8_quantize_admission(strided)
    assert_same_bytes(mxfp8_quantize(strided), reference(strided))
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    if not x.is_cuda:
        assert not mxfp8_quantize_admission(x)
    assert_same_bytes(mxfp8_quantize(x, swizzled=False), reference(x, swizzled=False))


def test_empty_input():
    q, sf = mxfp8_quantize(torch.zeros(0, 64, dtype=torch.bfloat16))
    assert q.shape == (0, 64) and sf.numel() == 0


@pytest.mark.parametrize(
    "x, message",
    [
        (torch.zeros(64, dtype=torch.bfloat16), "x must be 2-D"),
        (torch.zeros(2, 2, 64, dtype=torch.bfloat16), "x must be 2-D"),
        (torch.zeros(2, 64, dtype=torch.float32), "x must have dtype"),
        (torch.zeros(2, 48, dtype=torch.bfloat16), "x.shape"),
        ([[0.0] * 32], "x must be a torch.Tensor"),
    ],
)
def test_bad_input_raises_value_error(x, message):
    with pytest.raises(ValueError, match=message):
        mxfp8_quantize(x)
    verdict = mxfp8_quantize_admission(x)  # the admission refuses, never raises
    assert not verdict and verdict.reason.startswith("invalid arguments")
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.dtype != torch.float32:
        with pytest.raises(ValueError, match=message):
            reference(x)


def test_admission_must_be_an_admission():
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="^admission must be an Admission"):
        mxfp8_quantize(x, admission="kernel")


@pytest.mark.parametrize(
    "swizzled, match", [("no", "must be a bool"), (False, "must match the admission")]
)
def test_swizzled_is_checked_with_an_admitted_admission(swizzled, match):
    """A caller's admission spares the tensor checks, not the flag's: never a layout other
    than the one asked for."""
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    admission = admit(TRITON, "forced by the test", plan=_launch_shape(2, 64, True))
    with pytest.raises(ValueError, match=f"^swizzled {match}"):
        mxfp8_quantize(x, swizzled=swizzled, admission=admission)


# ---- GPU tier -----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_kernel_matches_reference_random_and_special():
    cases = 0
    for m in (1, 6, 8, 64, 128, 300):
        for k in (4096, 5120):
            for decade, seed in [(d, s) for d in (-2, -1, 0, 1, 2) for s in range(2)]:
                gen = torch.Generator().manual_seed(m * k + 10 * decade + seed)
                # Five decades across cases, and a spread of 2^+-4 between blocks of a row.
                spread = torch.pow(
                    2.0, torch.randint(-4, 5, (m, k // 32, 1), generator=gen).float()
                )
                x = torch.randn(m, k // 32, 32, generator=gen) * spread * 10.0**decade
                x = x.reshape(m, k).to(torch.bfloat16)
                specials = special_values_bf16(k)[: max(1, m // 4)]
                x[: specials.shape[0]] = specials
                x = x.cuda()
                for swizzled in (True, False):
                    assert_same_bytes(
                        mxfp8_quantize(x, swizzled=swizzled), reference(x, swizzled=swizzled)
                    )
                    cases += 1
    # Strided rows on the GPU too.
    x = kernel_inputs(64, 5120, seed=7, row_stride=5120 + 64).cuda()
    assert_same_bytes(mxfp8_quantize(x), reference(x))
    assert cases >= 200


def _sm_major() -> int:
    return torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(
    _sm_major() < 10,
    reason="FlashInfer compiles its mxfp8_quantize kernel body for SM100+ only (docs/specs.md B.6)",
)
def test_gpu_matches_flashinfer_on_sm100():
    flashinfer = pytest.importorskip("flashinfer")
    # Finite data only: FlashInfer's NaN/Inf bytes changed across versions (docs/specs.md B.8).
    for m, k, decade in [(1, 5120, 0), (6, 5120, -2), (128, 4096, 2), (300, 5120, 1)]:
        gen = torch.Generator().manual_seed(m + k)
        x = (torch.randn(m, k, generator=gen) * 10.0**decade).to(torch.bfloat16).cuda()
        q_fi, sf_fi = flashinfer.mxfp8_quantize(x, True)
        q, sf = mxfp8_quantize(x)
        assert torch.equal(q.view(torch.uint8), q_fi.view(torch.uint8)[:, :k])
        assert torch.equal(sf, sf_fi.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("shape", [(5, 0), (0, 64), (0, 0)])
@pytest.mark.parametrize("swizzled", [True, False])
def test_empty_inputs_give_the_references_empty_outputs(shape, swizzled):
    """[M, 0] has no blocks and [0, K] no rows: nothing to launch, on either path."""
    x = torch.empty(shape, dtype=torch.bfloat16)
    assert_same_bytes(mxfp8_quantize(x, swizzled=swizzled), reference(x, swizzled=swizzled))


@needs_kernel
def test_infinite_blocks_quantize_without_a_numpy_warning():
    """±Inf in a block makes scale 254 and a zero multiplier: Inf · 0 is NaN, +448. The
    interpreter selects it rather than multiplying, so numpy has nothing to warn about."""
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    x[0, 3], x[1, 40] = INF, -INF
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # over this module's ignore
        assert_same_bytes(mxfp8_quantize(x), reference(x))

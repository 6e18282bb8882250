import math

import numpy as np
import pytest
import torch

import dsv41_kernels.reference.moe_fused_gate as reference
from dsv41_kernels import interpreter
from dsv41_kernels.admission import admit
from dsv41_kernels.cases.moe_fused_gate import WEIGHT_ULP_BOUND, check_cases, fp32_ulp_distance
from dsv41_kernels.ops.moe.moe_fused_gate import (
    Kernel,
    MoeFusedGatePlan,
    moe_fused_gate,
    moe_fused_gate_admission,
    triton_plan,
)
from dsv41_kernels.ops.moe.moe_fused_gate_cuda import CUDA_MAX_TOKENS
from dsv41_kernels.reference import vision_topk
from test.machine import needs_kernel

IMAGE = 129264  # DeepSeek-V4.1's image token id


ROUTINGS = [
    # top_k, num_shared_slots, renormalize, scale_on_output
    dict(top_k=6, num_shared_slots=0, renormalize=True, scale_on_output=False),
    dict(top_k=7, num_shared_slots=1, renormalize=True, scale_on_output=True),
    dict(top_k=6, num_shared_slots=0, renormalize=False, scale_on_output=True),
    dict(top_k=5, num_shared_slots=2, renormalize=False, scale_on_output=False),
]


def make_case(gen, num_tokens, num_experts, *, dtype=torch.float32, specials=True, ties=False):
    """Logits with image and text tokens mixed; optionally ties, NaN, ±inf, subnormal-range."""
    if ties:  # few distinct logits and biases: many equal biased scores
        logits = torch.randint(-2, 3, (num_tokens, num_experts), generator=gen) / 2.0
        bias = torch.randint(0, 2, (num_experts,), generator=gen) / 4.0
        bias_alt = torch.randint(0, 2, (num_experts,), generator=gen) / 4.0
    else:
        logits = 2.0 * torch.randn(num_tokens, num_experts, generator=gen)
        bias = 0.1 * torch.randn(num_experts, generator=gen)
        bias_alt = 0.1 * torch.randn(num_experts, generator=gen)
    if specials:
        flat = logits.view(-1)
        picks = torch.randint(0, flat.numel(), (8,), generator=gen)
        values = [math.nan, math.nan, math.inf, -math.inf, 25.0, -100.0, -90.0, 20.0]
        flat[picks] = torch.tensor(values)
        if num_tokens > 1:  # a whole row of NaN and a whole row below exp's normal range
            logits[0] = math.nan
            logits[1] = -95.0 - torch.rand(num_experts, generator=gen)
    input_ids = torch.randint(0, 1000, (num_tokens,), generator=gen)
    input_ids[torch.rand(num_tokens, generator=gen) < 0.5] = IMAGE
    return logits.to(dtype), bias, bias_alt, input_ids


def numpy_sqrt_softplus(logits):
    """The interpreter kernel's score arithmetic: exp and log1p in float64, rounded to fp32,
    then an IEEE square root."""
    x = logits.float().numpy().astype(np.float64)
    big = x > 20.0
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.exp(np.where(big, 0.0, x))
        u = 1.0 + e
        log1p = np.log(u) * (e / np.where(u == 1.0, 1.0, u - 1.0))
    softplus = np.where(big, x, np.where(u == 1.0, e, log1p)).astype(np.float32)
    return torch.from_numpy(np.sqrt(softplus))  # IEEE sqrt (torch's CPU sqrt may be 1 ulp off)


# ---- the reference against a plain-Python loop ---------------------------------------------


def loop_vision_topk(
    logits,
    bias,
    bias_alt,
    input_ids,
    *,
    top_k,
    num_shared_slots=0,
    renormalize=True,
    renormalize_eps=1e-20,
    routed_scaling_factor=1.0,
    scale_on_output=False,
    num_token_non_padded=None,
):
    """One token at a time, Python sorting and numpy fp32 arithmetic (the stated rule)."""
    f32 = np.float32
    scores = reference.sqrt_softplus(logits).numpy()
    num_tokens, num_experts = scores.shape
    routed = top_k - num_shared_slots
    weights, ids = [], []
    for t in range(num_tokens):
        take_alt = bias_alt is not None and int(input_ids[t]) == IMAGE
        b = (bias_alt if take_alt else bias).float().numpy()
        biased = [f32(scores[t, e]) + f32(b[e]) for e in range(num_experts)]

        def rank(e, biased=biased):  # NaN first, then larger, then lower id
            v = float(biased[e])
            return (0, 0.0, e) if math.isnan(v) else (1, -v, e)

        chosen = sorted(range(num_experts), key=rank)[:routed]
        w = [f32(scores[t, e]) for e in chosen]
        total = f32(0.0)
        for value in w:
            total = f32(total + value)
        row_ids = chosen + [num_experts + j for j in range(num_shared_slots)]
        w += [f32(total / f32(routed_scaling_factor))] * num_shared_slots
        if renormalize:
            w = [f32(v / f32(total + f32(renormalize_eps))) for v in w]
        if scale_on_output:
            w = [f32(v * f32(routed_scaling_factor)) for v in w]
        if num_token_non_padded is not None and t >= int(num_token_non_padded):
            w, row_ids = [f32(0.0)] * top_k, [-1] * top_k
        weights.append(w)
        ids.append(row_ids)
    return (
        torch.from_numpy(np.array(weights, dtype=np.float32).reshape(num_tokens, top_k)),
        torch.tensor(ids, dtype=torch.int32).reshape(num_tokens, top_k),
    )


def assert_bits_equal(ours, ref):
    weights, ids = ours
    ref_weights, ref_ids = ref
    assert torch.equal(ids, ref_ids), (ids, ref_ids)
    assert torch.equal(weights.view(torch.int32), ref_weights.view(torch.int32)), (
        weights,
        ref_weights,
    )


INF_OVER_INF = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
"""An inf logit makes inf / inf = NaN weights, as in torch; numpy warns about it."""


@INF_OVER_INF
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("ties", [False, True])
def test_reference_matches_plain_loop(routing, ties):
    gen = torch.Generator().manual_seed(len(routing) * 7 + ties)
    for num_experts, padded in [(8, None), (16, 5), (64, torch.tensor(3))]:
        logits, bias, bias_alt, input_ids = make_case(gen, 7, num_experts, ties=ties)
        kwargs = dict(routed_scaling_factor=1.5, num_token_non_padded=padded, **routing)
        ours = vision_topk(logits, bias, bias_alt, input_ids, image_token_id=IMAGE, **kwargs)
        assert_bits_equal(ours, loop_vision_topk(logits, bias, bias_alt, input_ids, **kwargs))
        # Without the alternate bias every token takes ``bias``.
        ours = vision_topk(logits, bias, None, None, image_token_id=None, **kwargs)
        assert_bits_equal(ours, loop_vision_topk(logits, bias, None, None, **kwargs))


def test_reference_orderings():
    """Ties go to the lowest id, NaN ranks above +inf, -0.0 equals +0.0."""
    zero_bias = torch.zeros(6)
    logits = torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0, 0.0]])
    _, ids = vision_topk(logits, zero_bias, None, None, image_token_id=None, top_k=4)
    assert ids.tolist() == [[1, 2, 4, 0]]
    logits = torch.tensor([[0.0, math.inf, math.nan, 5.0, math.nan, -math.inf]])
    _, ids = vision_topk(logits, zero_bias, None, None, image_token_id=None, top_k=4)
    assert ids.tolist() == [[2, 4, 1, 3]]
    keys = reference.rank_keys(torch.tensor([[-0.0, 0.0, -1.0, math.inf, -math.nan]]))
    assert (keys[0, 0] >> 16) == (keys[0, 1] >> 16) and keys[0, 0] > keys[0, 1]
    assert keys[0, 2] < keys[0, 1] < keys[0, 3] < keys[0, 4]


# ---- the Triton kernel under the interpreter ----------------------------------------------


def run_both(logits, bias, bias_alt, input_ids, **kwargs):
    """The kernel without and with ``packed_out``; the two must agree bit for bit. Returns
    ``(weights, ids, packed)``."""
    plain = moe_fused_gate(
        logits, bias, bias_alt=bias_alt, input_ids=input_ids, image_token_id=IMAGE, **kwargs
    )
    packed = torch.full(plain[1].shape, 12345, dtype=torch.int32, device=logits.device)
    weights, ids = moe_fused_gate(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        image_token_id=IMAGE,
        packed_out=packed,
        **kwargs,
    )
    assert_bits_equal((weights, ids), plain)
    assert torch.equal(packed, reference.pack_topk(ids, weights))
    return weights, ids, packed


@INF_OVER_INF
@needs_kernel
@pytest.mark.parametrize("routing", ROUTINGS)
def test_kernel_matches_reference_bitwise(routing, monkeypatch):
    """Given the interpreter's scores, selection, sums, divisions and packing are bit-exact."""
    monkeypatch.setattr(reference, "sqrt_softplus", numpy_sqrt_softplus)
    gen = torch.Generator().manual_seed(11 + routing["top_k"])
    cases = [
        (5, 16, torch.float32, False, None),
        (4, 16, torch.bfloat16, True, 2),
        (6, 64, torch.float32, False, torch.tensor([4], dtype=torch.int32)),
        (3, 64, torch.bfloat16, True, torch.tensor(1)),
    ]
    for num_tokens, num_experts, dtype, ties, padded in cases:
        logits, bias, bias_alt, input_ids = make_case(
            gen, num_tokens, num_experts, dtype=dtype, ties=ties
        )
        kwargs = dict(routed_scaling_factor=1.5, num_token_non_padded=padded, **routing)
        *ours, _ = run_both(logits, bias, bias_alt, input_ids, **kwargs)
        ref = vision_topk(logits, bias, bias_alt, input_ids, image_token_id=IMAGE, **kwargs)
        assert_bits_equal(ours, ref)


@needs_kernel
def test_kernel_v41_shape_and_strides(monkeypatch):
    """E = 384, bf16 biases, strided logits (row stride and column stride), int32 input ids."""
    monkeypatch.setattr(reference, "sqrt_softplus", numpy_sqrt_softplus)
    gen = torch.Generator().manual_seed(5)
    logits, bias, bias_alt, input_ids = make_case(gen, 2, 384)
    wide = torch.zeros(2, 400)
    wide[:, :384] = logits
    transposed = logits.t().contiguous().t()
    for view in (wide[:, :384], transposed):
        kwargs = dict(top_k=6, routed_scaling_factor=2.5, scale_on_output=True)
        *ours, _ = run_both(view, bias.bfloat16(), bias_alt.bfloat16(), input_ids.int(), **kwargs)
        ref = vision_topk(
            logits, bias.bfloat16(), bias_alt.bfloat16(), input_ids, image_token_id=IMAGE, **kwargs
        )
        assert_bits_equal(ours, ref)


@needs_kernel
def test_check_cases_pass_on_this_device():
    """``dsv41-kernels check``'s cases, with torch's own scores (interpreter bound on CPU)."""
    on_gpu = torch.cuda.is_available()
    for case in check_cases(torch.device("cuda" if on_gpu else "cpu"), small=not on_gpu):
        assert case.admission, case.admission
        assert case.mismatches(case.run(), case.reference()) == 0, case.shape


def test_kernel_writes_caller_outputs_and_handles_empty():
    gen = torch.Generator().manual_seed(6)
    logits, bias, bias_alt, input_ids = make_case(gen, 3, 16, specials=False)
    weights = torch.empty(3, 6)
    ids = torch.empty(3, 6, dtype=torch.int32)
    got = moe_fused_gate(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        image_token_id=IMAGE,
        top_k=6,
        out_weights=weights,
        out_ids=ids,
    )
    assert got[0] is weights and got[1] is ids
    empty = moe_fused_gate(logits[:0], bias, top_k=6)
    assert empty[0].shape == (0, 6) and empty[1].dtype == torch.int32


# ---- admission, fallback and errors ------------------------------------------------------


def test_fallback_is_the_reference(monkeypatch):
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)  # admission refuses CPU tensors
    gen = torch.Generator().manual_seed(7)
    logits, bias, bias_alt, input_ids = make_case(gen, 5, 32)
    assert not moe_fused_gate_admission(logits, bias, top_k=6)
    kwargs = dict(top_k=7, num_shared_slots=1, num_token_non_padded=torch.tensor(4))
    packed = torch.empty(5, 7, dtype=torch.int32)
    ours = moe_fused_gate(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        image_token_id=IMAGE,
        packed_out=packed,
        **kwargs,
    )
    ref = vision_topk(logits, bias, bias_alt, input_ids, image_token_id=IMAGE, **kwargs)
    assert_bits_equal(ours, ref)
    assert torch.equal(packed, reference.pack_topk(*ref[::-1]))


@needs_kernel
def test_admission_reasons():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    logits, bias = torch.zeros(4, 384, device=device), torch.zeros(384, device=device)
    verdict = moe_fused_gate_admission(logits, bias, top_k=6)
    assert isinstance(verdict.plan, MoeFusedGatePlan), verdict
    assert verdict.kernel == verdict.plan.kernel.value and verdict.module == verdict.plan.module
    if device == "cpu":  # the interpreter: the Triton kernel, no dependent launch
        assert verdict.plan == triton_plan(logits, 6) and verdict.module is None
        assert not verdict.plan.launch.dependent_launch and not verdict.plan.launch.one_wave
    verdict = moe_fused_gate_admission(logits, bias, top_k=17)
    assert not verdict and "top_k 17" in verdict.reason
    wide = torch.zeros(4, 5000, device=device)
    verdict = moe_fused_gate_admission(wide, torch.zeros(5000, device=device), top_k=6)
    assert not verdict and "5000 experts" in verdict.reason
    verdict = moe_fused_gate_admission(logits.double(), bias, top_k=6)
    assert not verdict and "dtype" in verdict.reason


def test_wide_top_k_falls_back_to_the_reference():
    gen = torch.Generator().manual_seed(8)
    logits, bias, bias_alt, input_ids = make_case(gen, 3, 32)
    kwargs = dict(top_k=20, image_token_id=IMAGE)
    ours = moe_fused_gate(logits, bias, bias_alt=bias_alt, input_ids=input_ids, **kwargs)
    assert_bits_equal(ours, vision_topk(logits, bias, bias_alt, input_ids, **kwargs))


def _bad_calls():
    logits, bias = torch.zeros(4, 16), torch.zeros(16)
    ids4 = torch.full((4,), IMAGE)
    return (
        [
            (dict(bias=torch.zeros(15)), "^bias has 15"),
            (dict(bias=torch.zeros(16, 1)), "^bias must be 1-D"),
            (dict(bias_alt=torch.zeros(17), input_ids=ids4, image_token_id=IMAGE), "^bias_alt"),
            (
                dict(
                    bias_alt=bias, input_ids=torch.zeros(3, dtype=torch.long), image_token_id=IMAGE
                ),
                "^input_ids has 3",
            ),
            (dict(bias_alt=bias, input_ids=None, image_token_id=IMAGE), "^input_ids"),
            (dict(bias_alt=bias, input_ids=ids4, image_token_id=None), "image_token_id"),
            (dict(top_k=17), "top_k 17"),
            (dict(top_k=16, num_shared_slots=16), "num_shared_slots"),
            (dict(packed_out=torch.zeros(4, 6)), "^packed_out"),
            (dict(packed_out=torch.zeros(4, 5, dtype=torch.int32)), "^packed_out must have shape"),
            (dict(out_ids=torch.zeros(4, 6, dtype=torch.int64)), "^out_ids"),
            (dict(num_token_non_padded=torch.tensor([1, 2])), "^num_token_non_padded"),
            (dict(num_token_non_padded=2.0), "^num_token_non_padded"),
            (dict(logits=torch.zeros(4, 16, dtype=torch.int32)), "^logits"),
        ],
        logits,
        bias,
    )


@pytest.mark.parametrize("index", range(len(_bad_calls()[0])))
def test_bad_input_names_the_argument(index):
    calls, logits, bias = _bad_calls()
    change, match = calls[index]
    kwargs = dict(logits=logits, bias=bias, top_k=6) | change
    with pytest.raises(ValueError, match=match):
        moe_fused_gate(kwargs.pop("logits"), kwargs.pop("bias"), **kwargs)


def test_image_token_id_outside_the_ids_dtype_is_refused():
    """int32 ids are compared in int32: an id outside that range would match other tokens on
    the kernel than in the reference, so it is refused (naming it); int64 ids take it."""
    gen = torch.Generator().manual_seed(21)
    logits, bias, bias_alt, input_ids = make_case(gen, 4, 16, specials=False)
    for too_big in (2**31, -(2**31) - 1, 2**32 + IMAGE):
        kwargs = dict(bias_alt=bias_alt, input_ids=input_ids.int(), image_token_id=too_big)
        with pytest.raises(ValueError, match="image_token_id"):
            moe_fused_gate(logits, bias, top_k=2, **kwargs)
        verdict = moe_fused_gate_admission(logits, bias, top_k=2, **kwargs)
        assert not verdict and "image_token_id" in verdict.reason
    wide = dict(bias_alt=bias_alt, input_ids=input_ids, image_token_id=2**31)
    assert_bits_equal(
        moe_fused_gate(logits, bias, top_k=2, **wide),
        vision_topk(logits, bias, bias_alt, input_ids, image_token_id=2**31, top_k=2),
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(top_k=0), "top_k must be in"),
        (dict(top_k=-1), "top_k must be in"),
        (dict(top_k=6.0), "top_k must be an int"),
        (dict(top_k=True), "top_k must be an int, got the bool"),
        (dict(top_k=3, num_shared_slots=3), "num_shared_slots must be in"),
        (dict(top_k=3, num_shared_slots=np.float32(1)), "num_shared_slots must be an int"),
        (dict(top_k=3, num_token_non_padded=True), "num_token_non_padded"),
        (dict(top_k=3, renormalize_eps="1e-20"), "renormalize_eps must be a number"),
        (dict(top_k=3, routed_scaling_factor=None), "routed_scaling_factor must be a number"),
        (dict(top_k=3, renormalize=torch.ones(2)), "renormalize must be a bool"),
    ],
)
def test_bad_routing_options_name_themselves(kwargs, match):
    logits, bias = torch.randn(3, 16), torch.zeros(16)
    with pytest.raises(ValueError, match=match):
        moe_fused_gate(logits, bias, **kwargs)
    if set(kwargs) == {"top_k"}:  # the admission takes top_k alone, and refuses it
        verdict = moe_fused_gate_admission(logits, bias, **kwargs)
        assert not verdict and "top_k" in verdict.reason


def test_numpy_scalars_are_python_numbers():
    gen = torch.Generator().manual_seed(22)
    logits, bias, bias_alt, input_ids = make_case(gen, 5, 16, specials=False)
    vision = dict(bias_alt=bias_alt, input_ids=input_ids)
    plain = moe_fused_gate(
        logits,
        bias,
        **vision,
        image_token_id=IMAGE,
        top_k=4,
        num_shared_slots=1,
        routed_scaling_factor=1.5,
        num_token_non_padded=3,
    )
    numpy = moe_fused_gate(
        logits,
        bias,
        **vision,
        image_token_id=np.int64(IMAGE),
        top_k=np.int64(4),
        num_shared_slots=np.int32(1),
        routed_scaling_factor=np.float32(1.5),
        num_token_non_padded=np.int64(3),
        renormalize=np.bool_(True),
    )
    assert_bits_equal(numpy, plain)


def test_cuda_layout():
    """The CUDA kernel's layout by tokens an SM; the warp layout's CTA: the fewest warps on the
    busiest SM, then the larger CTA."""
    from dsv41_kernels.ops.moe.moe_fused_gate_cuda import cuda_layout, warp_layout_tokens_per_cta

    layouts = {t: cuda_layout(t, 132) for t in (1, 132, 133, 660, 661, 1536, 2048, 2560)}
    assert {t: (launch.warps, launch.tokens_per_cta) for t, launch in layouts.items()} == {
        1: (0, 1),  # a CTA a token
        132: (0, 1),
        133: (4, 1),  # 4 warps a token
        660: (4, 1),
        661: (1, 8),  # a warp a token, 8 a CTA
        1536: (1, 4),
        2048: (1, 8),
        2560: (1, 4),
    }
    picks = {t: warp_layout_tokens_per_cta(t, 132) for t in (257, 512, 528, 529, 1024, 1536, 2048)}
    assert picks == {257: 4, 512: 4, 528: 4, 529: 8, 1024: 8, 1536: 4, 2048: 8}
    assert warp_layout_tokens_per_cta(100, 1) == 4  # 100 warps on the one SM against 104
    assert warp_layout_tokens_per_cta(5, 1) == 8


# ---- one rule on every path: outputs, devices, scalars, the admission --------------------


def _overlapping_outputs():
    weights, ids = torch.empty(4, 3), torch.empty(4, 3, dtype=torch.int32)
    row = torch.empty(1, 3, dtype=torch.int32)
    return [
        (dict(out_weights=torch.empty(1, 3).expand(4, 3)), "^out_weights has overlapping"),
        (dict(out_ids=row.expand(4, 3)), "^out_ids has overlapping"),
        (dict(packed_out=row.expand(4, 3)), "^packed_out has overlapping"),
        (dict(out_weights=weights, out_ids=weights.view(torch.int32)), "out_weights and out_ids"),
        (dict(out_ids=ids, packed_out=ids), "packed_out and out_ids"),
    ]


@pytest.mark.parametrize("index", range(len(_overlapping_outputs())))
def test_overlapping_outputs_are_refused_on_every_path(index, path):
    """An expanded output made the kernel overwrite rows where the fallback raised from torch."""
    change, match = _overlapping_outputs()[index]
    logits, bias = torch.randn(4, 16), torch.zeros(16)
    with pytest.raises(ValueError, match=match):
        moe_fused_gate(logits, bias, top_k=3, **change)


def _elsewhere():
    meta = dict(device="meta")
    ids = torch.full((4,), IMAGE)
    vision = dict(bias_alt=torch.zeros(16), input_ids=ids, image_token_id=IMAGE)
    return [
        (dict(bias=torch.zeros(16, **meta)), "^bias must be on logits' device"),
        (vision | dict(bias_alt=torch.zeros(16, **meta)), "^bias_alt must be on"),
        (vision | dict(input_ids=ids.to("meta")), "^input_ids must be on"),
        (dict(num_token_non_padded=torch.tensor(2, **meta)), "^num_token_non_padded must be on"),
        (dict(out_weights=torch.empty(4, 3, **meta)), "^out_weights must be on"),
        (dict(out_ids=torch.empty(4, 3, dtype=torch.int32, **meta)), "^out_ids must be on"),
        (dict(packed_out=torch.empty(4, 3, dtype=torch.int32, **meta)), "^packed_out must be on"),
    ]


@pytest.mark.parametrize("index", range(len(_elsewhere())))
def test_tensors_on_another_device_are_refused_on_every_path(index, path):
    """Never a torch device error from inside, nor a fallback that "succeeds" into a meta
    output: a ValueError naming the tensor, before dispatch."""
    change, match = _elsewhere()[index]
    kwargs = dict(logits=torch.randn(4, 16), bias=torch.zeros(16), top_k=3) | change
    with pytest.raises(ValueError, match=match):
        moe_fused_gate(**kwargs)
    inputs = {"logits", "bias", "bias_alt", "input_ids", "image_token_id", "top_k"}
    admitted = moe_fused_gate_admission(
        **{k: v for k, v in kwargs.items() if k in inputs | {"num_token_non_padded"}}
    )
    if set(change) & {"bias", "bias_alt", "input_ids", "num_token_non_padded"}:
        assert not admitted and "must be on logits' device" in admitted.reason


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(image_token_id=True), "image_token_id must be an int, got the bool"),
        (dict(image_token_id=float(IMAGE)), "image_token_id must be an int"),
        (dict(num_token_non_padded=True), "num_token_non_padded must be an int"),
        (dict(num_token_non_padded=2.0), "num_token_non_padded must be an int"),
        (dict(num_token_non_padded=2**63), "num_token_non_padded must be in"),
    ],
)
def test_scalars_are_checked_with_an_admitted_admission(kwargs, match):
    """A caller's admission spares the tensor checks, never the scalar rule."""
    logits, bias, bias_alt = torch.randn(4, 16), torch.zeros(16), torch.zeros(16)
    vision = dict(bias_alt=bias_alt, input_ids=torch.full((4,), IMAGE), image_token_id=IMAGE)
    admission = admit("triton", "forced by the test", plan=triton_plan(logits, 3))
    with pytest.raises(ValueError, match=match):
        moe_fused_gate(logits, bias, top_k=3, **(vision | kwargs), admission=admission)


def test_the_kernel_is_given_python_ints(monkeypatch):
    """NumPy scalars reach Triton and CUDA as Python ints, with a caller's admission too."""
    import dsv41_kernels.ops.moe.moe_fused_gate as op

    seen = {}
    monkeypatch.setattr(op, "launch_triton", lambda *args, **kwargs: seen.update(kwargs))
    logits, bias = torch.randn(4, 16), torch.zeros(16)
    vision = dict(bias_alt=torch.zeros(16), input_ids=torch.full((4,), IMAGE))
    admission = admit("triton", "forced by the test", plan=triton_plan(logits, 3))
    for given in (None, admission):
        seen.clear()
        moe_fused_gate(
            logits, bias, **vision, image_token_id=np.int64(IMAGE), top_k=np.int32(3),
            num_token_non_padded=np.int64(2), admission=given,
        )  # fmt: skip
        if given is not None or interpreter.RUNS_IN_INTERPRETER:  # else the fallback ran
            assert type(seen["image_token_id"]) is int and type(seen["valid_rows"]) is int


def test_admission_must_be_an_admission():
    logits, bias = torch.randn(4, 16), torch.zeros(16)
    with pytest.raises(TypeError, match="^admission must be an Admission"):
        moe_fused_gate(logits, bias, top_k=3, admission="kernel")


# ---- GPU tier ------------------------------------------------------------------------------
# Triton compiles its kernel once per set of constexprs and specializations (E, routing, logits
# and ids dtypes, bias_alt or not, padding as an int or a tensor, packed or not, one wave or
# not, an int argument equal to 1 or a multiple of 16, a pointer 16-byte aligned or not), and a
# compile costs more than many cases. So the Triton cases come in groups of one compile each:
# every axis is covered, crossed with the others on the CUDA kernel only (prebuilt).

CUDA_KERNELS = {Kernel.CUDA_CTA_LAYOUT, Kernel.CUDA_LIST_LAYOUT, Kernel.CUDA_WARP_LAYOUT}
CUDA_EXPERTS = (384, 256, 512, 32, 160)
"""E = 32 M with M = 12, 8, 16, 1, 5: V4.1's and V4's rows, the widest and narrowest lists."""
LAYOUT_TOKENS = (64, 320, 1024, 1536)
"""The CUDA layouts on the H200 (132 SMs): a CTA a token, 4 warps a token, a warp a token 8 and
4 a CTA. Each and its padded count T - T // 4 are multiples of 16 (one Triton specialization)."""
LARGE_TOKENS = 16384
"""More than one wave of the Triton kernel (no early start), the warp layout at its largest."""


def device_case(gen, index, num_tokens, num_experts, *, dtype=torch.float32, ids=torch.int64,
                padding="none", view="contiguous"):  # fmt: skip
    """:func:`make_case` on the GPU, its values varied by ``index`` (ties, NaN, ±inf, a row of
    subnormal scores). ``padding``: ``num_token_non_padded`` none, an int or an int32 tensor;
    ``view``: contiguous logits, a row-strided slice of a wider output at column 0, or one at
    column 3 (an unaligned start). Returns the logits, biases, input ids and the padding."""
    device = torch.device("cuda")
    logits, bias, bias_alt, input_ids = make_case(
        gen, num_tokens, num_experts, specials=index % 3 != 2, ties=index % 5 == 0
    )
    if index % 4 == 3:  # a row of scores in exp's subnormal range
        logits[-1] = -100.0 + 12.0 * torch.rand(num_experts, generator=gen)
    logits = logits.to(device, dtype)
    bias, bias_alt, input_ids = bias.to(device), bias_alt.to(device), input_ids.to(device, ids)
    if view != "contiguous":
        start = {"rows": 0, "offset": 3}[view]
        wide = torch.zeros(num_tokens, num_experts + 32, dtype=dtype, device=device)
        wide[:, start : start + num_experts] = logits
        logits = wide[:, start : start + num_experts]
    limit = num_tokens - num_tokens // 4
    padded = {
        "none": None,
        "int": limit,
        "tensor": torch.tensor([limit], dtype=torch.int32, device=device),
    }[padding]
    return logits, bias, bias_alt, input_ids, padded


def reference_biased(logits, bias, bias_alt, input_ids):
    scores = reference.sqrt_softplus(logits)
    is_image = (input_ids == IMAGE)[:, None]
    return scores + torch.where(is_image, bias_alt.float(), bias.float())


def compare_to_reference(ours, ref, biased, routed):
    """(rows whose ids differ only between biased scores within 1 ulp, weight ulp histogram);
    asserts every other row has equal ids and weights within the stated bound."""
    weights, ids = ours
    ref_weights, ref_ids = ref
    differ = (ids != ref_ids).any(dim=1)
    near_ties = 0
    for row in differ.nonzero().flatten().tolist():
        ours_row, ref_row = ids[row].tolist(), ref_ids[row].tolist()
        for slot in range(routed):
            a, b = ours_row[slot], ref_row[slot]
            if a == b:
                continue
            assert 0 <= a < biased.shape[1] and 0 <= b < biased.shape[1], (row, ours_row, ref_row)
            gap = fp32_ulp_distance(biased[row, a], biased[row, b]).item()
            assert gap <= 1, f"row {row}: ids {ours_row} vs {ref_row}, biased gap {gap} ulp"
        near_ties += 1
    same = ~differ
    distance = fp32_ulp_distance(weights[same], ref_weights[same])
    assert int(distance.max().item() if distance.numel() else 0) <= WEIGHT_ULP_BOUND
    return near_ties, torch.bincount(distance.flatten().cpu(), minlength=WEIGHT_ULP_BOUND + 1)


def reference_cases():
    """``(num_tokens, num_experts, dtype, routing, padding, view)`` of
    :func:`test_gpu_random_cases`: fp32 (the CUDA kernel) over every E and routing, twice each,
    at 1 and 6 tokens and every layout's count; bf16 (the Triton kernel) one group of one
    compile a routing (packed and not: two); 16384 tokens three times."""
    tokens = (1, 6, *LAYOUT_TOKENS)
    paddings, views = ("none", "int", "tensor"), ("contiguous", "rows", "offset")
    cases = [
        (
            tokens[index % 6],
            CUDA_EXPERTS[index % 5],
            torch.float32,
            ROUTINGS[(index // 5) % 4],
            paddings[(index // 2) % 3],
            views[(index // 3) % 3],
        )
        for index in range(40)
    ]
    bf16 = torch.bfloat16
    cases += [(t, 384, bf16, ROUTINGS[0], "tensor", v) for t in (1, 6, 64, 1024) for v in views[:2]]
    cases += [(t, 256, bf16, ROUTINGS[1], p, "rows") for t in (64, 1024) for p in paddings[:2]]
    cases += [(6, 256, bf16, ROUTINGS[3], p, "contiguous") for p in paddings[:2]]
    cases += [
        (LARGE_TOKENS, 384, bf16, ROUTINGS[2], "int", "contiguous"),
        (LARGE_TOKENS, 384, torch.float32, ROUTINGS[0], "none", "rows"),
        (LARGE_TOKENS, 256, torch.float32, ROUTINGS[3], "tensor", "contiguous"),
    ]
    return cases


@pytest.mark.gpu
def test_gpu_random_cases(capsys):
    """The admitted kernel against the reference, within the stated bound (:func:`reference_cases`:
    E 32..512, T 1..16384, bf16/fp32, image tokens mixed, special values, padding, strides)."""
    gen = torch.Generator().manual_seed(2026)
    near_ties, histogram = 0, torch.zeros(WEIGHT_ULP_BOUND + 1, dtype=torch.int64)
    cases = reference_cases()
    for index, (num_tokens, num_experts, dtype, routing, padding, view) in enumerate(cases):
        logits, bias, bias_alt, input_ids, padded = device_case(
            gen, index, num_tokens, num_experts, dtype=dtype, padding=padding, view=view
        )
        kwargs = dict(routed_scaling_factor=1.5, num_token_non_padded=padded, **routing)
        admission = moe_fused_gate_admission(
            logits,
            bias,
            bias_alt=bias_alt,
            input_ids=input_ids,
            top_k=routing["top_k"],
            num_token_non_padded=padded,
        )
        expected = CUDA_KERNELS if dtype == torch.float32 else {Kernel.TRITON}
        assert admission.plan.kernel in expected, (index, admission)
        *ours, _ = run_both(logits, bias, bias_alt, input_ids, admission=admission, **kwargs)
        ref = vision_topk(logits, bias, bias_alt, input_ids, image_token_id=IMAGE, **kwargs)
        biased = reference_biased(logits, bias, bias_alt, input_ids)
        routed = routing["top_k"] - routing["num_shared_slots"]
        ties, counts = compare_to_reference(ours, ref, biased, routed)
        near_ties += ties
        histogram += counts
    with capsys.disabled():
        print(
            f"\nmoe_fused_gate GPU: {len(cases)} cases, {near_ties} rows with ids differing at "
            f"biased scores within 1 ulp, weight ulp distances {histogram.tolist()}"
        )


def forced_triton(logits, bias, bias_alt, input_ids, **kwargs):
    """Our Triton kernel, whatever the admission would pick, with packed ids."""
    plan = triton_plan(logits, kwargs["top_k"])
    packed = torch.empty(logits.shape[0], kwargs["top_k"], dtype=torch.int32, device=logits.device)
    weights, ids = moe_fused_gate(
        logits,
        bias,
        bias_alt=bias_alt,
        input_ids=input_ids,
        image_token_id=IMAGE,
        packed_out=packed,
        admission=admit(plan.kernel.value, "forced", plan=plan),
        **kwargs,
    )
    return weights, ids, packed


EQUALITY_GROUPS = [
    # E, routing, bias_alt, input_ids dtype, padding, view, token counts: one Triton compile each
    (384, 0, True, torch.int64, "int", "rows", LAYOUT_TOKENS),
    (384, 1, True, torch.int32, "tensor", "offset", (1, *LAYOUT_TOKENS)),
    (384, 2, False, torch.int64, "none", "contiguous", LAYOUT_TOKENS),
    (384, 3, True, torch.int64, "tensor", "contiguous", (1, *LAYOUT_TOKENS)),
    (256, 0, True, torch.int32, "none", "offset", LAYOUT_TOKENS),
    (512, 1, True, torch.int64, "tensor", "rows", (1, *LAYOUT_TOKENS)),
    (32, 2, True, torch.int64, "int", "contiguous", LAYOUT_TOKENS),
    (160, 3, False, torch.int64, "tensor", "rows", (1, *LAYOUT_TOKENS)),
    (384, 0, True, torch.int64, "int", "contiguous", (LARGE_TOKENS,)),
]


@pytest.mark.gpu
def test_gpu_cuda_kernel_equals_triton_kernel():
    """The CUDA kernel against the Triton one, bit for bit (weights, ids, packed ids), over
    :data:`EQUALITY_GROUPS`: every E and routing, every layout, ties, NaN, ±inf, subnormal
    scores, strided and unaligned rows, int32/int64 ids, padding as an int and as a tensor."""
    gen = torch.Generator().manual_seed(2027)
    seen = set()
    index = 0
    for num_experts, r, alt, ids_dtype, padding, view, token_counts in EQUALITY_GROUPS:
        routing = ROUTINGS[r]
        for num_tokens in token_counts:
            logits, bias, bias_alt, input_ids, padded = device_case(
                gen, index, num_tokens, num_experts, ids=ids_dtype, padding=padding, view=view
            )
            index += 1
            if not alt:
                bias_alt = input_ids = None
            kwargs = dict(routed_scaling_factor=1.5, num_token_non_padded=padded, **routing)
            admission = moe_fused_gate_admission(
                logits,
                bias,
                bias_alt=bias_alt,
                input_ids=input_ids,
                top_k=routing["top_k"],
                num_token_non_padded=padded,
            )
            assert admission.plan.kernel in CUDA_KERNELS, admission
            seen.add(admission.plan.launch)
            *ours, packed = run_both(
                logits, bias, bias_alt, input_ids, admission=admission, **kwargs
            )
            weights, ids, their_packed = forced_triton(logits, bias, bias_alt, input_ids, **kwargs)
            assert_bits_equal(ours, (weights, ids))
            assert torch.equal(packed, their_packed), (num_experts, r, num_tokens)
    assert {launch.warps for launch in seen} == {0, 1, 4}, seen  # every layout ran


@pytest.mark.gpu
def test_gpu_cuda_kernel_admission():
    """The CUDA kernel takes fp32 logits with unit-stride rows and 32 M experts up to 512; the
    rest goes to the Triton kernel."""
    logits = torch.zeros(6, 400, device="cuda")
    bias = torch.zeros(384, device="cuda")
    kernel = lambda x, b=bias, **kw: moe_fused_gate_admission(x, b, top_k=6, **kw).plan.kernel
    assert kernel(logits[:, :384]) == Kernel.CUDA_CTA_LAYOUT
    assert kernel(logits[:, 1:385]) == Kernel.CUDA_CTA_LAYOUT  # any row start
    assert kernel(logits[:, :384].bfloat16()) == Kernel.TRITON
    assert kernel(logits[:, :336], torch.zeros(336, device="cuda")) == Kernel.TRITON  # 336 % 32
    wide = torch.zeros(6, 1024, device="cuda")
    assert kernel(wide, torch.zeros(1024, device="cuda")) == Kernel.TRITON
    assert kernel(logits[:, :384], bias.bfloat16()) == Kernel.TRITON
    assert kernel(torch.zeros(384, 6, device="cuda").t()) == Kernel.TRITON  # column stride 6
    many = torch.zeros(CUDA_MAX_TOKENS + 1, 384, device="cuda")
    assert kernel(many) == Kernel.TRITON  # more than CUDA_MAX_TOKENS
    admission = moe_fused_gate_admission(logits[:, :384], bias, top_k=6)
    assert admission.kernel == "cuda cta layout" and admission.module == "moe_fused_gate"


@pytest.mark.gpu
def test_gpu_cuda_kernel_refuses_an_unknown_layout():
    from dsv41_kernels.jit import load_module
    from dsv41_kernels.ops.moe.moe_fused_gate_cuda import MODULE

    logits, bias = torch.zeros(6, 384, device="cuda"), torch.zeros(384, device="cuda")
    weights, ids = torch.empty(6, 6, device="cuda"), torch.empty(6, 6, dtype=torch.int32).cuda()
    none = torch.empty(0, device="cuda")
    run = load_module(MODULE, 0).moe_fused_gate_cuda
    args = (logits, bias, none, none, 0, none, 6, weights, ids, none, 0, True, 1e-20, 1.0, False)
    for warps, tokens_per_cta, named in ((3, 1, "warps must"), (4, 2, "tokens_per_cta must")):
        with pytest.raises(ValueError, match=named):
            run(*args, warps, tokens_per_cta)
    with pytest.raises(ValueError, match="tokens_per_cta must"):
        run(*args, 1, 9)


@pytest.mark.gpu
def test_gpu_subnormal_scores_are_kept():
    """exp of logits below about -87 is subnormal in torch; the kernel must not flush it."""
    device = torch.device("cuda")
    deep = torch.linspace(-100.0, -88.0, 384, device=device).repeat(6, 1)  # subnormal softplus
    deep[1] = deep[1].flip(0)
    bias = torch.zeros(384, device=device)
    for renormalize in (False, True):
        ours = moe_fused_gate(deep, bias, top_k=6, renormalize=renormalize)
        ref = vision_topk(
            deep, bias, None, None, image_token_id=None, top_k=6, renormalize=renormalize
        )
        assert_bits_equal(ours, ref)
        assert (ours[0] > 0).all(), ours  # a flush to zero would leave zeros here


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # Triton, CUDA kernel
def test_gpu_cuda_graph_replay_reads_device_count(dtype):
    """Captured once, replayed with new logits and a new non-padded count: no host sync."""
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(10)
    logits, bias, bias_alt, input_ids = (
        t.to(device) for t in make_case(gen, 6, 384, dtype=dtype, specials=False)
    )
    count = torch.tensor([6], dtype=torch.int32, device=device)
    weights = torch.empty(6, 6, device=device)
    ids = torch.empty(6, 6, dtype=torch.int32, device=device)
    packed = torch.empty(6, 6, dtype=torch.int32, device=device)
    kwargs = dict(bias_alt=bias_alt, input_ids=input_ids, image_token_id=IMAGE, top_k=6)

    def step():
        moe_fused_gate(
            logits,
            bias,
            num_token_non_padded=count,
            packed_out=packed,
            out_weights=weights,
            out_ids=ids,
            **kwargs,
        )

    step()  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    new_logits = torch.randn(6, 384, generator=gen).to(device, dtype)
    logits.copy_(new_logits)
    count.fill_(4)
    graph.replay()
    torch.cuda.synchronize()
    ref = vision_topk(
        new_logits, bias, bias_alt, input_ids, top_k=6, image_token_id=IMAGE, num_token_non_padded=4
    )
    assert_bits_equal((weights, ids), ref)
    assert torch.equal(packed, reference.pack_topk(ids, weights))


@needs_kernel
def test_an_admitted_call_validates_its_inputs_once(monkeypatch):
    """A caller holding the admission (the SGLang hook) costs one validation, not two."""
    import dsv41_kernels.ops.moe.moe_fused_gate as op

    calls = []
    real = op._validate_inputs
    monkeypatch.setattr(op, "_validate_inputs", lambda *a: calls.append(1) or real(*a))
    logits = torch.randn(6, 64)
    bias = torch.randn(64)
    admission = op.moe_fused_gate_admission(logits, bias, top_k=6)
    assert admission, admission.reason
    expected = op.moe_fused_gate(logits, bias, top_k=6, admission=admission)
    assert len(calls) == 1
    op.moe_fused_gate(logits, bias, top_k=6)
    assert len(calls) == 2
    torch.testing.assert_close(op.moe_fused_gate(logits, bias, top_k=6), expected, rtol=0, atol=0)

import pytest
import torch

from dsv41_kernels import interpreter
from dsv41_kernels.devices import multiprocessors
from dsv41_kernels.ops.speculative.argmax_plan import ArgmaxKernel, triton_launch
from dsv41_kernels.ops.speculative.row_argmax import (
    launch_triton,
    row_argmax,
    row_argmax_admission,
)
from test.machine import needs_kernel

from .logit_cases import random_logits, special_rows


def assert_argmax_equal(logits):
    ours = row_argmax(logits)
    ref = torch.argmax(logits, dim=-1)
    assert ours.dtype == torch.int64 and ours.shape == ref.shape
    assert torch.equal(ours, ref), (ours, ref)
    plan = row_argmax_admission(logits).plan
    if plan is not None and plan.cuda is not None:  # the Triton kernel must hold too
        triton_out = torch.empty_like(ref)
        launch_triton(logits, triton_out, triton_launch(*logits.shape))
        assert torch.equal(triton_out, ref), (triton_out, ref)


# ---- admission -----------------------------------------------------------------------------

ADMISSION = [
    # (shape, dtype, make-view, admitted, reason fragment)
    ((6, 129280), torch.float32, None, True, "6 rows"),
    ((6, 129280), torch.bfloat16, None, True, "6 rows"),
    ((6, 129280), torch.float16, None, True, "6 rows"),
    ((64, 4096), torch.float32, None, True, "64 rows"),
    ((65, 4096), torch.float32, None, False, "65 rows"),
    ((384, 129280), torch.float32, None, True, "384 rows"),
    ((385, 129280), torch.float32, None, False, "385 rows"),
    ((6, 4095), torch.float32, None, False, "vocab 4095"),
    ((6, 129280), torch.float64, None, False, "dtype"),
    ((6, 8192), torch.float32, "transpose", False, "stride"),
    ((2, 3, 8192), torch.float32, None, False, "3-D"),
]


@needs_kernel
@pytest.mark.parametrize("shape,dtype,view,ok,why", ADMISSION)
def test_admission_table(shape, dtype, view, ok, why):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.empty(shape, dtype=dtype, device=device)
    if view == "transpose":
        x = torch.empty(shape[::-1], dtype=dtype, device=device).t()
    verdict = row_argmax_admission(x)
    assert verdict.ok is ok and why in verdict.reason, verdict
    assert verdict.kernel in ([k.value for k in ArgmaxKernel] if ok else [None])
    assert verdict.kernel == (verdict.plan.kernel.value if ok else None)


def test_admission_refuses_cpu_without_interpreter(monkeypatch):
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    verdict = row_argmax_admission(torch.empty(6, 8192))
    assert not verdict and "cpu" in verdict.reason


# ---- fallback and errors --------------------------------------------------------------------


def test_fallback_matches_torch(monkeypatch):
    monkeypatch.setattr(
        interpreter, "RUNS_IN_INTERPRETER", False
    )  # admission refuses CPU: torch.argmax path
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([random_logits(30, 4096, gen), torch.stack(special_rows(4096))])
    assert not row_argmax_admission(x)
    assert_argmax_equal(x)
    assert_argmax_equal(x[:, :100])  # narrow: refused for vocab


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.empty(6),), "2-D"),
        ((torch.empty(6, 0),), "empty rows"),
        ((torch.empty(6, 8, dtype=torch.int32),), "floating point"),
        (("logits",), "torch.Tensor"),
        # float8 is floating point, but torch.argmax (the fallback) does not take it
        ((torch.zeros(6, 8, dtype=torch.float8_e4m3fn),), "float8_e4m3fn"),
        ((torch.zeros(6, 8, dtype=torch.float8_e5m2),), "float8_e5m2"),
        ((torch.empty(6, 8, device="meta"),), "meta"),  # no values: never a meta result
    ],
)
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        row_argmax(*args)
    with pytest.raises(ValueError, match="logits"):
        row_argmax(*args)
    verdict = row_argmax_admission(*args)  # the admission refuses, never raises
    assert not verdict and match in verdict.reason and "logits" in verdict.reason


def test_bad_out():
    with pytest.raises(ValueError, match="out"):
        row_argmax(torch.randn(3, 8), out=torch.empty(4, dtype=torch.int64))
    assert not row_argmax_admission(torch.randn(3, 8), out=torch.empty(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="out"):
        row_argmax(torch.randn(3, 8), out=torch.empty(3, dtype=torch.int32))


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_admission_must_be_an_admission(monkeypatch, path):
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    for bad in ("kernel", True, 1):
        with pytest.raises(TypeError, match="admission"):
            row_argmax(torch.randn(3, 8), admission=bad)


def test_zero_rows():
    assert row_argmax(torch.empty(0, 4096)).shape == (0,)


# ---- the kernel (Triton interpreter on CPU, the real thing on a GPU) ------------------------


@needs_kernel
@pytest.mark.parametrize("vocab", [4096, 5003, 8192 + 17])
def test_special_values(vocab):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.stack(special_rows(vocab)).to(device)
    assert row_argmax_admission(x)
    assert_argmax_equal(x)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes(dtype):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.stack(special_rows(5003)).to(device, dtype)
    assert_argmax_equal(x)


@needs_kernel
def test_random_rows_with_planted_values():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(1)
    for _ in range(8):
        rows = int(torch.randint(1, 9, (1,), generator=gen))
        vocab = int(torch.randint(4096, 9000, (1,), generator=gen))
        assert_argmax_equal(random_logits(rows, vocab, gen).to(device))


@needs_kernel
def test_strided_row_view():
    """Rows of a wider buffer: the row stride comes from the tensor, never assumed."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(2)
    wide = random_logits(12, 6000, gen).to(device)
    view = wide[::2, 100:5100]  # row stride 12000, 5000 columns
    assert view.stride() == (12000, 1) and row_argmax_admission(view)
    assert_argmax_equal(view)
    assert_argmax_equal(wide[1::2, 3:4100])  # rows not 16-byte aligned: the Triton kernel
    wide[2, 150] = float("nan")
    assert_argmax_equal(view)


@needs_kernel
def test_out_and_repeated_launches():
    """The workspace re-arms itself: back-to-back launches stay exact."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    out = torch.full((5,), -1, dtype=torch.int64, device=device)
    for _ in range(3):
        x = random_logits(5, 4500, gen).to(device)
        assert row_argmax(x, out=out) is out
        assert torch.equal(out, torch.argmax(x, dim=-1))


# ---- GPU tier ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_production_shape_300_cases():
    gen = torch.Generator().manual_seed(4)
    bad = triton_bad = 0
    triton_out = torch.empty(6, dtype=torch.int64, device="cuda")
    for _ in range(300):
        x = random_logits(6, 129280, gen).cuda()
        assert row_argmax_admission(x).kernel == ArgmaxKernel.CLUSTER_A_ROW.value
        ref = torch.argmax(x, dim=-1)
        bad += int((row_argmax(x) != ref).sum())
        launch_triton(x, triton_out, triton_launch(6, 129280))
        triton_bad += int((triton_out != ref).sum())
    assert bad == 0 and triton_bad == 0


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [4096, 4097, 32000, 129280, 151936, 262144, 262143])
def test_gpu_rows_and_vocab_sweep(vocab):
    """One row, odd counts and 64 rows (one wave and several, for the early start) at every
    item count of the cluster kernel and the Triton kernel's unaligned rows."""
    gen = torch.Generator().manual_seed(vocab)
    for rows in (1, 3, 7, 64):
        x = random_logits(rows, vocab, gen).cuda()
        assert row_argmax_admission(x)
        assert_argmax_equal(x)
    x = torch.stack(special_rows(vocab)).cuda()
    assert_argmax_equal(x)
    assert_argmax_equal(x.bfloat16())


@pytest.mark.gpu
def test_gpu_many_rows_at_wide_vocab():
    gen = torch.Generator().manual_seed(5)
    for rows in (65, 128, 256, 384):
        assert_argmax_equal(random_logits(rows, 129280, gen).cuda())


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_new_data():
    gen = torch.Generator().manual_seed(6)
    x = random_logits(6, 129280, gen).cuda()
    out = torch.empty(6, dtype=torch.int64, device="cuda")
    row_argmax(x, out=out)  # workspace made outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        row_argmax(x, out=out)
    for _ in range(20):
        x.copy_(random_logits(6, 129280, gen).cuda())
        graph.replay()
        assert torch.equal(out, torch.argmax(x, dim=-1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_one_cta_a_row_kernel(dtype):
    """From 96 rows the CUDA argmax takes one CTA a row while the rows fit the GPU at once, else
    clusters: both against torch.argmax at 96..384 rows, whole and partial last vectors, the
    special rows (NaN first / middle / last, ±Inf, signed zeros, ties) spread over the batch."""
    gen = torch.Generator().manual_seed(96)
    kernels = set()
    for vocab in (129280, 129283, 65541, 151936):  # vocabs >= 65536: up to 384 rows admitted
        specials = torch.stack(special_rows(vocab))
        for rows in (96, 97, 128, 200, 264, 384):
            values = random_logits(rows, vocab, gen)
            picks = torch.randperm(rows, generator=gen)[: specials.shape[0]]
            values[picks] = specials
            # Rows of a wider buffer: 16-byte aligned starts, a partial last vector at odd vocabs.
            wide = torch.zeros(rows, (vocab + 15) // 8 * 8, dtype=dtype, device="cuda")
            x = wide[:, :vocab]
            x.copy_(values)
            plan = row_argmax_admission(x).plan
            assert plan.cuda is not None, (vocab, rows)
            one_cta = plan.kernel == ArgmaxKernel.CTA_A_ROW
            kernels.add((plan.kernel, plan.cuda.vectors if one_cta else None))
            assert torch.equal(row_argmax(x), torch.argmax(x, dim=-1)), (vocab, rows)
    if 128 <= multiprocessors(0) < 192:  # an H200's 132: up to one row an SM, two, clusters
        one_cta = ArgmaxKernel.CTA_A_ROW
        assert kernels == {(one_cta, 4), (one_cta, 2), (ArgmaxKernel.CLUSTER_A_ROW, None)}

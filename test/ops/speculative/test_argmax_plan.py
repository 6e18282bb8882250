"""The argmax's plan, on a CPU: the CUDA kernel and launch shape chosen in Python are, for every
rows x vocab x element size x GPU, the ones ``row_argmax.cu`` chose by itself before the plan
existed (its launch(), transcribed below), over modelled occupancies; the constants and shapes
are the CUDA source's; the admission carries the plan and the launchers pass it on as is."""

from __future__ import annotations

import re

import pytest
import torch

from dsv41_kernels.jit import CSRC
from dsv41_kernels.ops.speculative import accept_greedy as accept_module
from dsv41_kernels.ops.speculative import argmax_plan
from dsv41_kernels.ops.speculative import row_argmax as row_argmax_module
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy, accept_greedy_admission
from dsv41_kernels.ops.speculative.argmax_plan import (
    CUDA_KERNEL_IDS,
    ArgmaxKernel,
    cuda_plan,
)
from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission
from test.machine import on_cuda, pretend_arch, pretend_toolchain

CLUSTER, ROWS = "cluster", "rows"  # the two kernels, as the transcription names them


def launch_before_the_plan(rows: int, vocab: int, itemsize: int, resident) -> tuple:
    """row_argmax.cu's launch() and its launch_rows / launch_items before the plan, line by
    line: (kernel, threads, vectors, cluster, early_start). ``resident(kernel, threads,
    vectors, cluster)`` stands for resident_ctas of that kernel instance."""
    k_threads, k_max_cluster = 256, 16
    k_row_kernel_min_rows, k_row_threads, k_row_unroll, k_row_deep_unroll = 96, 1024, 2, 4
    k_row_early_start_max_idle = 8
    k_vec = 16 // itemsize

    def one_wave(kernel, ctas, threads, vectors, cluster=0):
        return ctas <= resident(kernel, threads, vectors, cluster)

    def launch_rows(unroll):
        idle = resident(ROWS, k_row_threads, unroll, 0) - rows
        early_start = idle >= 0 and idle <= k_row_early_start_max_idle
        return ROWS, k_row_threads, unroll, 0, early_start

    def launch_items(items):
        k_chunk = k_threads * k_vec * items
        cluster = max(2, (vocab + k_chunk - 1) // k_chunk)
        assert cluster <= k_max_cluster
        early_start = one_wave(CLUSTER, rows * cluster, k_threads, items, cluster)
        return CLUSTER, k_threads, items, cluster, early_start

    if rows >= k_row_kernel_min_rows:
        if one_wave(ROWS, rows, k_row_threads, k_row_deep_unroll):
            return launch_rows(k_row_deep_unroll)
        if one_wave(ROWS, rows, k_row_threads, k_row_unroll):
            return launch_rows(k_row_unroll)
    per_item = k_threads * k_vec * k_max_cluster
    for items in (2, 4, 8, 16):
        if vocab <= items * per_item:
            return launch_items(items)
    raise ValueError(f"vocab {vocab} > {16 * per_item}")


def model(sms: int, deep_per_sm: int, gpc: int):
    """Occupancy of a GPU of ``sms`` SMs in GPCs of ``gpc`` (clusters never span two): the
    deep one-CTA-a-row shape ``deep_per_sm`` CTAs an SM, the other two, the cluster kernel
    four; ``sms`` 0: the calculator cannot say. Returns ``resident`` for both rules."""

    def resident(kernel, threads, vectors, cluster):
        if sms == 0:
            return 0
        if kernel in (ROWS, ArgmaxKernel.CTA_A_ROW):
            return sms * (deep_per_sm if vectors == 4 else 2)
        full, rest = divmod(sms, gpc)
        per_gpc = lambda n: n * 4 // cluster  # noqa: E731
        return (full * per_gpc(gpc) + per_gpc(rest)) * cluster

    return resident


def vocabularies(itemsize: int) -> list[int]:
    """Every item count's bounds and the cluster sizes' around them, and the usual vocabularies,
    up to the widest row admitted."""
    widest = argmax_plan.CLUSTER_MAX_ROW_BYTES // itemsize
    per_item = 256 * (16 // itemsize) * 16
    bounds = {4096, 4097, 5003, 32000, 129280, 129283, 151936, widest}
    for items in (2, 4, 8, 16):
        chunk = 256 * (16 // itemsize) * items
        bounds |= {items * per_item + d for d in (-1, 0, 1)}
        bounds |= {c * chunk + d for c in (2, 3, 9, 15) for d in (0, 1)}
    return sorted(v for v in bounds if 4096 <= v <= widest)


GPUS = [(132, 1, 18), (132, 2, 16), (148, 1, 18), (114, 1, 16), (78, 1, 14), (16, 1, 8), (0, 1, 8)]


@pytest.mark.parametrize("sms,deep_per_sm,gpc", GPUS)
@pytest.mark.parametrize("itemsize", [4, 2])
def test_plan_is_the_rule_launch_applied(sms, deep_per_sm, gpc, itemsize):
    resident = model(sms, deep_per_sm, gpc)
    names = {ArgmaxKernel.CLUSTER_A_ROW: CLUSTER, ArgmaxKernel.CTA_A_ROW: ROWS}
    for vocab in vocabularies(itemsize):
        for rows in range(1, argmax_plan.max_rows(vocab) + 1):
            plan = cuda_plan(rows, vocab, itemsize, resident)
            c = plan.cuda
            ours = (names[plan.kernel], c.threads, c.vectors, c.cluster, c.early_start)
            assert ours == launch_before_the_plan(rows, vocab, itemsize, resident), (rows, vocab)


def read(file: str) -> str:
    return (CSRC / file).read_text()


def cuda_constant(name: str, file: str) -> int:
    found = re.search(rf"constexpr int {name} = (\d+);", read(file))
    assert found, (name, file)
    return int(found.group(1))


def test_the_plan_names_the_shapes_the_module_compiles():
    kernels, launch = "row_argmax_kernels.cuh", "row_argmax_launch.cuh"
    in_cuda = {
        "kThreads": cuda_constant("kThreads", kernels),
        "kMaxCluster": cuda_constant("kMaxCluster", kernels),
        "kRowThreads": cuda_constant("kRowThreads", kernels),
        "kRowDeepUnroll, kRowUnroll": (
            cuda_constant("kRowDeepUnroll", kernels),
            cuda_constant("kRowUnroll", kernels),
        ),
        "kClusterARow": cuda_constant("kClusterARow", launch),
        "kCtaARow": cuda_constant("kCtaARow", launch),
        "compiled cluster vectors": tuple(
            int(v) for v in re.findall(r"clusters && shape.vectors == (\d+)", read(launch))
        ),
    }
    in_python = {
        "kThreads": argmax_plan.CLUSTER_THREADS,
        "kMaxCluster": argmax_plan.MAX_CLUSTER,
        "kRowThreads": argmax_plan.CTA_A_ROW_THREADS,
        "kRowDeepUnroll, kRowUnroll": argmax_plan.CTA_A_ROW_VECTORS,
        "kClusterARow": CUDA_KERNEL_IDS[ArgmaxKernel.CLUSTER_A_ROW],
        "kCtaARow": CUDA_KERNEL_IDS[ArgmaxKernel.CTA_A_ROW],
        "compiled cluster vectors": argmax_plan.CLUSTER_VECTORS,
    }
    assert in_python == in_cuda


class FakeModule:
    """The CUDA module's calls, recorded; occupancy from a modelled H200."""

    def __init__(self):
        self.calls = []
        self.resident = model(132, 1, 18)

    def row_argmax_resident_ctas(self, logits, accept, kernel, threads, vectors, cluster):
        kind = {0: ArgmaxKernel.CLUSTER_A_ROW, 1: ArgmaxKernel.CTA_A_ROW}[kernel]
        self.calls.append(("resident", accept, kernel, threads, vectors, cluster))
        return self.resident(kind, threads, vectors, cluster)

    def row_argmax_cuda(self, logits, out, *shape):
        self.calls.append(("row_argmax", *shape))

    def accept_greedy_cuda(self, *args):
        self.calls.append(("accept_greedy", *args[-5:]))


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CPU that says sm_90, with the module at hand as FakeModule (nothing launches)."""
    pretend_arch(9, monkeypatch.setattr)
    pretend_toolchain(True, monkeypatch.setattr)
    fake = FakeModule()
    for module in (argmax_plan, row_argmax_module, accept_module):
        monkeypatch.setattr(module, "cuda_module", lambda device: fake)
    monkeypatch.setattr(argmax_plan, "_resident", {})
    monkeypatch.setattr(argmax_plan, "_plans", {})
    workspace = (torch.full((16 * 384,), -1), torch.zeros(384, dtype=torch.int64))
    monkeypatch.setattr(accept_module.CLUSTER_WORKSPACE, "get", lambda device: workspace)
    return fake


@pytest.mark.parametrize(
    "rows,kernel,shape",
    [
        (6, ArgmaxKernel.CLUSTER_A_ROW, (256, 8, 16, True)),
        (64, ArgmaxKernel.CLUSTER_A_ROW, (256, 8, 16, False)),
        (96, ArgmaxKernel.CTA_A_ROW, (1024, 4, 0, False)),
        (128, ArgmaxKernel.CTA_A_ROW, (1024, 4, 0, True)),
        (264, ArgmaxKernel.CTA_A_ROW, (1024, 2, 0, True)),
        (384, ArgmaxKernel.CLUSTER_A_ROW, (256, 8, 16, False)),
    ],
)
def test_admission_carries_the_plan_the_launch_runs(fake_gpu, rows, kernel, shape):
    logits = on_cuda(torch.empty(rows, 129280))
    admission = row_argmax_admission(logits)
    assert admission.kernel == kernel.value and admission.module == "row_argmax"
    c = admission.plan.cuda
    assert (admission.plan.kernel, (c.threads, c.vectors, c.cluster, c.early_start)) == (
        kernel,
        shape,
    )
    fake_gpu.calls.clear()
    row_argmax(logits, out=on_cuda(torch.empty(rows, dtype=torch.int64)), admission=admission)
    assert fake_gpu.calls == [("row_argmax", CUDA_KERNEL_IDS[kernel], *shape)]


def test_the_accept_plans_with_its_own_kernels(fake_gpu):
    logits = on_cuda(torch.empty(12, 129280))
    candidates = on_cuda(torch.zeros(2, 6, dtype=torch.int64))
    admission = accept_greedy_admission(candidates, logits)
    assert admission.kernel == ArgmaxKernel.CLUSTER_A_ROW.value
    assert {call[1] for call in fake_gpu.calls if call[0] == "resident"} == {True}
    out = tuple(on_cuda(torch.empty(2, dtype=d)) for d in (torch.int32, torch.int64, torch.int32))
    fake_gpu.calls.clear()
    accept_greedy(candidates, logits, out=out, admission=admission)
    assert fake_gpu.calls == [("accept_greedy", 0, 256, 8, 16, True)]
    candidates = on_cuda(torch.zeros(1, 17, dtype=torch.int64))
    wide = accept_greedy_admission(candidates, on_cuda(torch.empty(17, 129280)))
    assert wide.kernel == ArgmaxKernel.TRITON.value and wide.plan.cuda is None  # n > 16


def test_a_module_that_does_not_load_leaves_the_admission_whole(fake_gpu, monkeypatch):
    """The admission never raises: it plans as with a calculator that cannot say (clusters, no
    early start), tries the load once, and the launch raises the module's error."""
    tries = []

    def broken(device):
        tries.append(device)
        raise RuntimeError("no module")

    monkeypatch.setattr(argmax_plan, "cuda_module", broken)
    monkeypatch.setattr(row_argmax_module, "cuda_module", broken)
    monkeypatch.setattr(argmax_plan, "_unloadable", set())
    logits = on_cuda(torch.empty(128, 129280))
    for _ in range(2):
        admission = row_argmax_admission(logits)
        assert admission.plan.kernel == ArgmaxKernel.CLUSTER_A_ROW
        assert not admission.plan.cuda.early_start
    assert len(tries) == 1
    with pytest.raises(RuntimeError, match="no module"):
        row_argmax(logits, out=on_cuda(torch.empty(128, dtype=torch.int64)), admission=admission)

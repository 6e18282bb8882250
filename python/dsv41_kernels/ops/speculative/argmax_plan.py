"""Which kernel reduces the rows of :mod:`.row_argmax` and :mod:`.accept_greedy`, and in which
launch shape: the admission of their logits and its plan.

``torch.argmax`` reduces each row in a single thread block, so six rows keep six of the
H200's 132 SMs busy while 3 MB of logits wait to be read. Both ops spread every row over the
whole machine instead, with one of three kernels (:class:`ArgmaxKernel`):

- ``cuda cluster a row`` (sm_90+, ``sgl-kernel/csrc/row_argmax_kernels.cuh``): a thread-block
  cluster of 2 to 16 CTAs a row whose warps send their winners into the leader CTA's shared
  memory: one launch, no global atomics;
- ``cuda one CTA a row`` (sm_90+, same file): from :data:`CTA_A_ROW_MIN_ROWS` rows while the
  rows fit the GPU at once, where a row for every SM leaves the cluster's exchange nothing to
  buy;
- ``triton`` (more rows, other GPUs, the Triton interpreter): the multi-block Triton reduction
  of :mod:`.argmax_reduction`.

:func:`admit_logits` chooses once per call and returns the choice as the admission's
:class:`ArgmaxPlan`; the launchers run what it says and the CUDA module only checks that the
shape is one it compiled. Among the CUDA shapes the choice reads how many CTAs of each kernel
instance the GPU holds at once (the occupancy calculator, asked of the module once per device,
dtype and instance: :func:`module_occupancy`), so every input of a shape runs the same kernel
in the same shape.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_tensor,
    cuda_kernel_runs,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import sm_major
from dsv41_kernels.jit import load_module

MODULE = "row_argmax"  # sgl-kernel/csrc/row_argmax.cu: both ops' CUDA kernels
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_VOCAB = 4096  # below it one block a row is as fast
MAX_ADMITTED_ROWS = 384  # DSpark's verify at bs 64 (6 rows a request), SGLang's own bound there

VECTOR_BYTES = 16  # the CUDA kernels load 16-byte vectors
CLUSTER_THREADS = 256  # the cluster kernel's CTA (kThreads in row_argmax_kernels.cuh)
CLUSTER_VECTORS = (2, 4, 8, 16)  # vectors a thread, the fewest that cover the row first
MAX_CLUSTER = 16  # CTAs a cluster: the non-portable size of sm_90 and sm_100
CLUSTER_MAX_ROW_BYTES = MAX_CLUSTER * CLUSTER_THREADS * CLUSTER_VECTORS[-1] * VECTOR_BYTES
CTA_A_ROW_THREADS = 1024  # kRowThreads
CTA_A_ROW_VECTORS = (4, 2)  # kRowDeepUnroll while the rows fit one CTA an SM, else kRowUnroll
CTA_A_ROW_MIN_ROWS = 96  # below it the cluster kernel's spread beats one CTA a row
# One CTA a row lets the next launch start early only while it leaves at most this many CTA
# slots idle: the next grid's CTAs waiting on idle SMs slow this one down.
EARLY_START_MAX_IDLE = 8


class ArgmaxKernel(enum.Enum):
    """The kernel that reduces the rows; its value is what ``Admission.kernel`` says."""

    CLUSTER_A_ROW = "cuda cluster a row"
    CTA_A_ROW = "cuda one CTA a row"
    TRITON = "triton"


CUDA_KERNEL_IDS = {ArgmaxKernel.CLUSTER_A_ROW: 0, ArgmaxKernel.CTA_A_ROW: 1}
"""How the CUDA module names the kernels (``kClusterARow``, ``kCtaARow`` in
``row_argmax_launch.cuh``)."""


@dataclass(frozen=True)
class CudaLaunch:
    """A CUDA kernel's launch shape, as the module takes it."""

    threads: int  # threads a CTA
    vectors: int  # 16-byte vectors a thread: items (cluster a row), a batch (one CTA a row)
    cluster: int  # CTAs a row's cluster; 0 for one CTA a row
    early_start: bool  # the next dependent launch may start as this grid starts


@dataclass(frozen=True)
class TritonLaunch:
    """The Triton reduction's launch shape: columns a program, a tile, and warps."""

    chunk: int
    block: int
    num_warps: int

    def grid(self, rows: int, vocab: int) -> tuple[int, int]:
        return triton.cdiv(vocab, self.chunk), rows


@dataclass(frozen=True)
class ArgmaxPlan:
    """What the launcher runs: the kernel and its launch shape (``cuda`` for the CUDA kernels,
    ``triton`` for the Triton one)."""

    kernel: ArgmaxKernel
    cuda: CudaLaunch | None = None
    triton: TritonLaunch | None = None

    def cuda_shape(self) -> tuple[int, int, int, int, bool]:
        """The CUDA exports' trailing arguments: kernel id, threads, vectors, cluster and
        early start (the plan must name a CUDA kernel)."""
        c = self.cuda
        return CUDA_KERNEL_IDS[self.kernel], c.threads, c.vectors, c.cluster, c.early_start

    def __str__(self) -> str:
        if self.cuda is None:
            t = self.triton
            return f"{self.kernel.value} ({t.chunk}-column chunks, {t.num_warps} warps)"
        c = self.cuda
        ctas = f"{c.cluster} CTAs x " if c.cluster else ""
        early = ", early start" if c.early_start else ""
        return f"{self.kernel.value} ({ctas}{c.threads} threads x {c.vectors} vectors{early})"


def triton_launch(rows: int, vocab: int) -> TritonLaunch:
    """About 192 programs over all rows, 2K-16K columns each, in 1024-column tiles: the best
    of a sweep on the H200 at 1, 6 and 64 rows."""
    chunk = triton.next_power_of_2(triton.cdiv(rows * vocab, 192))
    chunk = min(max(chunk, 2048), 16384)
    return TritonLaunch(chunk, 1024, 4 if chunk <= 2048 else 8)


Occupancy = Callable[[ArgmaxKernel, int, int, int], int]
"""CTAs of a CUDA kernel instance (kernel, threads, vectors, cluster: 0 for none) the GPU holds
at once, 0 when that cannot be said."""


def cluster_launch(
    rows: int, vocab: int, itemsize: int, threads: int, vectors: int, occupancy: Occupancy
) -> CudaLaunch:
    """The cluster kernel at ``threads`` x ``vectors``: the fewest CTAs that cover a row (at
    least 2: st.async needs a cluster of two), starting the next launch early in one wave."""
    chunk = threads * (VECTOR_BYTES // itemsize) * vectors
    cluster = max(2, triton.cdiv(vocab, chunk))
    resident = occupancy(ArgmaxKernel.CLUSTER_A_ROW, threads, vectors, cluster)
    return CudaLaunch(threads, vectors, cluster, rows * cluster <= resident)


def cta_a_row_launch(
    rows: int, threads: int, vectors: int, occupancy: Occupancy
) -> CudaLaunch | None:
    """One CTA a row at ``threads`` x ``vectors`` if the rows fit the GPU at once, else None."""
    resident = occupancy(ArgmaxKernel.CTA_A_ROW, threads, vectors, 0)
    if rows > resident:
        return None
    return CudaLaunch(threads, vectors, 0, resident - rows <= EARLY_START_MAX_IDLE)


def cuda_plan(rows: int, vocab: int, itemsize: int, occupancy: Occupancy) -> ArgmaxPlan:
    """The CUDA kernel and shape for ``rows`` x ``vocab`` elements of ``itemsize`` bytes (at
    most :data:`CLUSTER_MAX_ROW_BYTES` a row): one CTA a row from :data:`CTA_A_ROW_MIN_ROWS`
    rows while they fit the GPU at once, else clusters of the fewest vectors a thread that keep
    a row within :data:`MAX_CLUSTER` CTAs."""
    if rows >= CTA_A_ROW_MIN_ROWS:
        for vectors in CTA_A_ROW_VECTORS:
            launch = cta_a_row_launch(rows, CTA_A_ROW_THREADS, vectors, occupancy)
            if launch is not None:
                return ArgmaxPlan(ArgmaxKernel.CTA_A_ROW, cuda=launch)
    per_vector = CLUSTER_THREADS * (VECTOR_BYTES // itemsize) * MAX_CLUSTER  # columns
    for vectors in CLUSTER_VECTORS:
        if vocab <= vectors * per_vector:
            launch = cluster_launch(rows, vocab, itemsize, CLUSTER_THREADS, vectors, occupancy)
            return ArgmaxPlan(ArgmaxKernel.CLUSTER_A_ROW, cuda=launch)
    raise ValueError(f"rows of {vocab} x {itemsize} bytes > {CLUSTER_MAX_ROW_BYTES}")


def cuda_module(device: torch.device):
    """The ``row_argmax.cu`` module for ``device`` (both ops' CUDA kernels), prebuilt, cached
    or built (:func:`dsv41_kernels.jit.load_module`)."""
    return load_module(MODULE, device.index or 0)


_resident: dict[tuple, int] = {}
_unloadable: set[int] = set()  # devices whose module raised as it loaded


def module_occupancy(logits: torch.Tensor, accept: bool) -> Occupancy:
    """The occupancy of the kernel instances for ``logits``' device and dtype (``accept``: the
    accept's instances), as the module's occupancy calculator answers (answers cached). A
    module that does not load answers 0, once: the launch then raises its error."""
    device = logits.device.index or 0

    def occupancy(kernel: ArgmaxKernel, threads: int, vectors: int, cluster: int) -> int:
        key = (device, logits.dtype, accept, kernel, threads, vectors, cluster)
        if key in _resident or device in _unloadable:
            return _resident.get(key, 0)
        try:
            module = cuda_module(logits.device)
        except Exception:  # the launch loads it again and raises the error to the caller
            _unloadable.add(device)
            return 0
        kernel_id = CUDA_KERNEL_IDS[kernel]
        try:
            ctas = module.row_argmax_resident_ctas(
                logits, accept, kernel_id, threads, vectors, cluster
            )
        except Exception:  # as a calculator that cannot say: the launch reports the error
            return 0
        if ctas > 0:  # 0: the calculator could not say this time; asked again next time
            _resident[key] = ctas
        return ctas

    return occupancy


_plans: dict[tuple, ArgmaxPlan] = {}


def planned(logits: torch.Tensor, accept: bool) -> ArgmaxPlan:
    """:func:`cuda_plan` for ``logits`` on their GPU (``accept``: the accept's kernels), kept
    per device, dtype and shape once every occupancy it read was answered: it is a function of
    those answers alone."""
    rows, vocab = logits.shape
    key = (logits.device.index, logits.dtype, accept, rows, vocab)
    plan = _plans.get(key)
    if plan is None:
        occupancy, answers = module_occupancy(logits, accept), []

        def answered(kernel: ArgmaxKernel, threads: int, vectors: int, cluster: int) -> int:
            answers.append(occupancy(kernel, threads, vectors, cluster))
            return answers[-1]

        plan = cuda_plan(rows, vocab, logits.element_size(), answered)
        if all(answers):
            _plans[key] = plan
    return plan


def cuda_kernel(logits: torch.Tensor) -> tuple[bool, str]:
    """Whether the CUDA kernels take these logits (sm_90+, 16-byte aligned rows, its module at
    hand), with the note for the admission's reason: see
    :func:`~dsv41_kernels.admission.cuda_kernel_runs`. Pure: shapes, strides, alignment, the
    device and the module's files."""
    return cuda_kernel_runs(
        MODULE,
        logits,
        logits.is_cuda
        and sm_major(logits.device.index) >= 9
        and logits.shape[1] * logits.element_size() <= CLUSTER_MAX_ROW_BYTES
        and logits.data_ptr() % 16 == 0
        and (logits.stride(0) * logits.element_size()) % 16 == 0,
    )


def max_rows(vocab: int) -> int:
    """Rows up to which spreading rows over the machine beats a block a row (H200):
    :data:`MAX_ADMITTED_ROWS` at wide vocabularies."""
    return 64 if vocab < 65536 else MAX_ADMITTED_ROWS


ARGMAX_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""The floating-point dtypes ``torch.argmax`` (the fallback) takes: not float8."""


def check_values(name: str, t: torch.Tensor) -> None:
    """Raise ValueError naming ``name`` for a meta tensor: it holds no values, and the torch
    path would return a meta result as if an argmax had been taken."""
    if t.is_meta:
        raise ValueError(f"{name} is a meta tensor: it holds no values to take the argmax of")


def check_logits_dtype(name: str, t: torch.Tensor, dtypes, why: str) -> None:
    """ValueError naming ``name`` unless ``t`` has one of ``dtypes`` (``why``: what they are)."""
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(
            f"{name} must be floating point of a dtype {why} ({names}), "
            f"got {str(t.dtype).replace('torch.', '')}"
        )


def validate_logits(logits) -> None:
    """Raise ValueError naming ``logits`` unless it is 2-D, of a dtype ``torch.argmax`` takes,
    with values (not meta) and columns."""
    check_tensor("logits", logits, ndim=2)
    check_values("logits", logits)
    check_logits_dtype("logits", logits, ARGMAX_DTYPES, "torch.argmax takes")
    if logits.shape[1] == 0:
        raise ValueError("logits has empty rows (0 columns): argmax is undefined")


def admit_logits(logits: torch.Tensor, *, accept: bool = False, cuda: bool = True) -> Admission:
    """Whether validated ``logits`` take a multi-block kernel, and the :class:`ArgmaxPlan`
    (``accept``: for the accept's kernels; ``cuda``: False keeps them off the CUDA kernels).
    Reads no values; loads the CUDA module to ask its occupancy when a CUDA kernel runs."""
    where = triton_device(logits)
    if not where:
        return where
    if logits.dtype not in SUPPORTED_DTYPES:
        return refuse(f"dtype {logits.dtype} (kernel: fp32, bf16, fp16)")
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        return refuse("last-dim stride != 1")
    if vocab < MIN_VOCAB:
        return refuse(f"vocab {vocab} < {MIN_VOCAB}: one block per row is as fast")
    if not 1 <= rows <= max_rows(vocab):
        return refuse(f"{rows} rows: torch.argmax's block per row already fills the machine")
    on_cuda, note = cuda_kernel(logits)
    if on_cuda and cuda:
        plan = planned(logits, accept)
    else:
        plan = ArgmaxPlan(ArgmaxKernel.TRITON, triton=triton_launch(rows, vocab))
    module = MODULE if plan.cuda is not None else None
    reason = f"{where.reason}, {plan}{note}, {rows} rows x {vocab}"
    return admit(plan.kernel.value, reason, module, plan)

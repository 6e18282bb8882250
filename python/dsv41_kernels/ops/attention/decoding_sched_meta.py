"""FlashMLA's decoding tile-scheduler metadata, computed by a whole block instead of one thread.

FlashMLA's sparse decode splits the batch's KV blocks over ``num_sm_parts`` persistent
partitions. The schedule depends on every step's ``topk_length``, so it is recomputed inside
the captured decode graph, four times per step, and FlashMLA's own ``<<<1, 32>>>`` kernel walks
every partition on one thread with a global store per record, all of it on the critical path.
Here a block of 256 threads computes the per-request costs and writes the records. Kernels
(:class:`SchedKernel`, the admission's ``kernel``, chosen by the batch size):

- ``cuda closed form``: the walk over partitions replaced by its closed form (a few register
  operations per request on one thread, then one thread per partition locates its begin and
  end in shared memory);
- ``cuda in place``: the walk itself on one thread, staged in the outputs, for batches too
  large to stage in shared memory.

Contract: writes, in place and on the current stream, exactly what the schedulers of
sgl-flash-mla 1.0.0 write (the FlashMLA SGLang 0.5.23 calls; its legacy SM90 kernels consume
this schedule on Hopper; docs/specs.md section A): ``tile_scheduler_metadata`` int32
``[num_sm_parts, 8]`` (fields in
:data:`dsv41_kernels.reference.decoding_sched_meta.RECORD_FIELDS`) and ``num_splits`` int32
``[batch_size + 1]``. Sparse mode for ``topk > 0``, dense mode for ``topk == -1``.

Exactness: bit-identical to :func:`dsv41_kernels.reference.decoding_sched_meta` and to the
FlashMLA-structured baseline kernel (``baseline_decoding_sched_meta`` in the same ``.cu``, which
:mod:`dsv41_kernels.cases.decoding_sched_meta` runs) over all 8 fields, including the left-over
partitions (``[b, b - 1, 0, end block of request b - 1, 0, 0, 0]``: ``begin_block_idx = 0`` as
sgl-flash-mla 1.0.0 writes it) and ``_pad`` (written 0; FlashMLA never writes it). The kernel
path never syncs the host and never allocates, so it can be captured in a CUDA graph; the
fallback (CPU tensors, non-contiguous layouts, no CUDA module: none prebuilt, cached or
buildable) runs the reference on the lengths' values, which syncs when they live on a GPU.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import torch

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_device,
    check_inputs_apart,
    check_int,
    check_outputs,
    check_tensor,
    invalid,
    refuse,
)
from dsv41_kernels.jit import load_module, module_available
from dsv41_kernels.reference.decoding_sched_meta import decoding_sched_meta as reference_sched_meta

# FlashMLA's constants (deepseek-ai/FlashMLA csrc/api/sparse_decode.h, dense_decode.h; restated
# in docs/specs.md A.2).
BLOCK_SIZE_N = 64  # KV tokens per block, every implementation ("block_size_topk")
FIXED_OVERHEAD_NUM_BLOCKS = 5  # cost of starting a chunk of a request, in blocks
FIXED_OVERHEAD_NUM_BLOCKS_SM100_HEAD128 = 3  # SM100 head-128 kernel at head dim 512 (V4)

_INT32_MAX = 2**31 - 1
MODULE = "decoding_sched_meta"  # sgl-kernel/csrc/decoding_sched_meta.cu
_LENGTH_NAMES = ("topk_length", "extra_topk_length", "seqlens_k")  # the kernels' argument order
_SUMMARY_BYTES = 48  # the closed form's WalkSummary, ahead of its staging in shared memory
STAGING_LIMIT_BYTES = 48 * 1024  # what a launch gets without an opt-in attribute call


def num_sm_parts(*, num_sms: int, s_q: int, h_q: int, arch_major: int, d_qk: int = 512) -> int:
    """FlashMLA's partition count for sparse decode (C integer division, left to right).

    SM90 (``h_q`` 64 or 128): ``num_sms / s_q / (h_q / 64)``; SM100 head 64, or head 128 at
    ``d_qk`` 576 (the head-64 kernel run twice): ``num_sms / s_q``; SM100 head 128 at ``d_qk``
    512 (V4): ``num_sms / s_q / 2``. Always at least 1. Other combinations raise ValueError.
    """
    num_sms, s_q = check_int("num_sms", num_sms, low=1), check_int("s_q", s_q, low=1)
    h_q, arch_major = check_int("h_q", h_q), check_int("arch_major", arch_major)
    d_qk = check_int("d_qk", d_qk)
    if h_q not in (64, 128) or d_qk not in (512, 576):
        raise ValueError(
            f"FlashMLA's sparse decode takes h_q 64/128 and d_qk 512/576, got {h_q}, {d_qk}"
        )
    if arch_major == 9:
        parts = num_sms // s_q // (h_q // 64)
    elif arch_major == 10:
        parts = num_sms // s_q // (2 if h_q == 128 and d_qk == 512 else 1)
    else:
        raise ValueError(
            f"arch_major: FlashMLA's sparse decode runs on SM90 and SM100, not SM{arch_major}x"
        )
    return max(parts, 1)


def fixed_overhead_num_blocks(*, arch_major: int, h_q: int, d_qk: int = 512) -> int:
    """FlashMLA's per-chunk overhead: 3 for the SM100 head-128 kernel at d_qk 512, else 5."""
    arch_major, h_q = check_int("arch_major", arch_major), check_int("h_q", h_q)
    d_qk = check_int("d_qk", d_qk)
    if arch_major == 10 and h_q == 128 and d_qk == 512:
        return FIXED_OVERHEAD_NUM_BLOCKS_SM100_HEAD128
    return FIXED_OVERHEAD_NUM_BLOCKS


def device_sched_config(
    device: torch.device, *, s_q: int, h_q: int, d_qk: int = 512
) -> tuple[int, int]:
    """``(num_sm_parts, fixed_overhead_num_blocks)`` FlashMLA uses on a CUDA ``device``."""
    s_q, h_q, d_qk = check_int("s_q", s_q, low=1), check_int("h_q", h_q), check_int("d_qk", d_qk)
    device = check_device("device", device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device (FlashMLA's schedule), got {device}")
    props = torch.cuda.get_device_properties(device)
    return (
        num_sm_parts(
            num_sms=props.multi_processor_count, s_q=s_q, h_q=h_q, arch_major=props.major, d_qk=d_qk
        ),
        fixed_overhead_num_blocks(arch_major=props.major, h_q=h_q, d_qk=d_qk),
    )


@dataclass(frozen=True)
class DecodingSchedConfig:
    """The scalars of one schedule: fixed for a model and device, shared by every step."""

    topk: int  # indices per request (sparse decode, > 0), or -1 for dense decode
    extra_topk: int = 0  # indices per request into the extra cache; 0 without one
    block_size_n: int = BLOCK_SIZE_N  # KV tokens per block
    fixed_overhead_num_blocks: int = FIXED_OVERHEAD_NUM_BLOCKS  # see fixed_overhead_num_blocks()


def _checked_config(config) -> DecodingSchedConfig:
    """``config`` with every field checked (ValueError naming the field) and a Python int."""
    if not isinstance(config, DecodingSchedConfig):
        raise ValueError(f"config must be a DecodingSchedConfig, got {type(config).__name__}")
    field = lambda name, low: check_int(name, getattr(config, name), low=low, high=_INT32_MAX)
    topk = check_int("topk", config.topk)
    return DecodingSchedConfig(
        topk=topk if topk == -1 else field("topk", 1),
        extra_topk=field("extra_topk", 0),
        block_size_n=field("block_size_n", 1),
        fixed_overhead_num_blocks=field("fixed_overhead_num_blocks", 0),
    )


def _fits_int32(config: DecodingSchedConfig, batch_size: int, num_sm_parts: int) -> None:
    """Raise ValueError naming the fields when a quantity the kernels compute in C ``int`` from
    them overflows int32: each request's tokens (``topk`` rounded up to a block, plus
    ``extra_topk``), the batch's cost, its share per partition and the payload (the walk's and
    the closed form's every other quantity is bounded by these), the split count. Requests are
    taken at the config's lengths (a ``topk_length`` is at most ``topk``; dense requests at
    one block): the kernels read the lengths' values, the host never does."""
    topk, extra, block, overhead = (
        config.topk,
        config.extra_topk,
        config.block_size_n,
        config.fixed_overhead_num_blocks,
    )

    def fits(value: int, quantity: str) -> None:
        if value > _INT32_MAX:
            raise ValueError(f"{quantity} = {value} overflows int32 (the kernels' C int)")

    blocks = 1
    if topk != -1:
        tokens = topk
        if extra:
            fits(topk + block - 1, "config.topk + config.block_size_n - 1")
            tokens = -(-topk // block) * block + extra
            fits(tokens, "config.topk rounded up to config.block_size_n + config.extra_topk")
        blocks = (tokens - 1) // block + 1
    cost = f"batch_size {batch_size} * (blocks a request + config.fixed_overhead_num_blocks)"
    total = batch_size * (blocks + overhead)
    fits(total, cost)
    fits(total + num_sm_parts - 1, f"{cost} + num_sm_parts - 1")
    payload = f"the payload, ({cost}) / num_sm_parts + config.fixed_overhead_num_blocks"
    fits(-(-total // num_sm_parts) + overhead, payload)
    fits(batch_size + num_sm_parts - 1, "batch_size + num_sm_parts - 1 (the split count)")


def _present(topk_length, extra_topk_length, seqlens_k) -> dict[str, torch.Tensor]:
    """The length tensors given, by argument name."""
    given = zip(_LENGTH_NAMES, (topk_length, extra_topk_length, seqlens_k), strict=True)
    return {name: t for name, t in given if t is not None}


def _validate(
    tile_scheduler_metadata, num_splits, config, lengths: dict[str, torch.Tensor]
) -> DecodingSchedConfig:
    """Raise ValueError naming the argument (or the config field); returns the checked config
    (:func:`_checked_config`)."""
    check_tensor("tile_scheduler_metadata", tile_scheduler_metadata, dtypes=(torch.int32,), ndim=2)
    check_tensor("num_splits", num_splits, dtypes=(torch.int32,), ndim=1)
    parts, fields = tile_scheduler_metadata.shape
    if fields != 8 or not 1 <= parts <= _INT32_MAX // 8:
        raise ValueError(
            f"tile_scheduler_metadata must be [num_sm_parts >= 1, 8], got {(parts, fields)}"
        )
    b = num_splits.shape[0] - 1
    if not 1 <= b < _INT32_MAX:
        raise ValueError(f"num_splits must be [batch_size + 1] with batch_size >= 1, got {b + 1}")
    if num_splits.device != tile_scheduler_metadata.device:
        raise ValueError("num_splits must be on tile_scheduler_metadata's device")
    check_outputs({"tile_scheduler_metadata": tile_scheduler_metadata, "num_splits": num_splits})
    config = _checked_config(config)
    _fits_int32(config, b, parts)
    topk = config.topk
    dense_only = {"seqlens_k"}
    for name, t in lengths.items():
        if (name in dense_only) != (topk == -1):
            mode = "dense mode (topk == -1)" if name in dense_only else "sparse mode (topk > 0)"
            raise ValueError(f"{name} is only taken in {mode}, got topk={topk}")
        check_tensor(name, t, dtypes=(torch.int32,), ndim=1)
        if t.shape[0] != b:
            raise ValueError(f"{name} must be [batch_size={b}], got {tuple(t.shape)}")
        if t.device != tile_scheduler_metadata.device:
            raise ValueError(f"{name} must be on tile_scheduler_metadata's device")
    if topk == -1 and "seqlens_k" not in lengths:
        raise ValueError("seqlens_k is required in dense mode (topk == -1)")
    outputs = {"tile_scheduler_metadata": tile_scheduler_metadata, "num_splits": num_splits}
    check_inputs_apart(outputs, lengths)
    return config


class SchedKernel(enum.Enum):
    """The kernels of ``decoding_sched_meta.cu`` the op launches, one block of 256 threads."""

    CLOSED_FORM = "cuda closed form"  # sched_meta_closed_form_kernel, staged in shared memory
    IN_PLACE = "cuda in place"  # sched_meta_in_place_kernel, the walk staged in the outputs


@dataclass(frozen=True)
class DecodingSchedPlan:
    """What the launcher runs: the kernel, and the schedule's scalars as validated."""

    kernel: SchedKernel
    config: DecodingSchedConfig


def staged_bytes(batch_size: int) -> int:
    """Shared memory the closed form stages: the summary, then 3 * batch_size + 1 int32."""
    return _SUMMARY_BYTES + 4 * (3 * batch_size + 1)


def _plan(tile_scheduler_metadata, num_splits, config, lengths: dict[str, torch.Tensor]):
    """The admission of valid arguments (``config`` checked), with its plan."""
    if not tile_scheduler_metadata.is_cuda:
        return refuse(f"{tile_scheduler_metadata.device.type} tensors: the kernel is CUDA")
    found = module_available(MODULE, tile_scheduler_metadata.device.index)
    if not found:
        return refuse(f"{MODULE}: {found.reason}")
    outputs = {"tile_scheduler_metadata": tile_scheduler_metadata, "num_splits": num_splits}
    for name, t in {**outputs, **lengths}.items():
        if not t.is_contiguous():
            return refuse(f"{name} is not contiguous")
    if tile_scheduler_metadata.data_ptr() % 16 != 0:
        return refuse("tile_scheduler_metadata is not 16-byte aligned (records are stored as int4)")
    batch, parts = num_splits.shape[0] - 1, tile_scheduler_metadata.shape[0]
    fits = staged_bytes(batch) <= STAGING_LIMIT_BYTES
    kernel = SchedKernel.CLOSED_FORM if fits else SchedKernel.IN_PLACE
    return admit(
        kernel.value,
        f"{kernel.value}, batch {batch}, {parts} parts ({MODULE}: {found.reason})",
        MODULE,
        DecodingSchedPlan(kernel, config),
    )


def decoding_sched_meta_admission(
    tile_scheduler_metadata: torch.Tensor,
    num_splits: torch.Tensor,
    config: DecodingSchedConfig,
    *,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    seqlens_k: torch.Tensor | None = None,
) -> Admission:
    """Which kernel runs (:class:`SchedKernel`), or why none does (the reference then); pure
    (shapes, layouts, device, the module's availability), reads no values."""
    lengths = _present(topk_length, extra_topk_length, seqlens_k)
    try:
        config = _validate(tile_scheduler_metadata, num_splits, config, lengths)
    except ValueError as e:
        return invalid(e)
    return _plan(tile_scheduler_metadata, num_splits, config, lengths)


def kernel_arguments(tile_scheduler_metadata, num_splits, config, lengths) -> tuple:
    """The arguments every entry of ``decoding_sched_meta.cu`` takes, in its order (``lengths``:
    the length tensors given, by name; an absent one is passed as a flag and a stand-in)."""
    absent = num_splits  # any int32 tensor on the device: never read when its flag is False
    return (
        tile_scheduler_metadata,
        num_splits,
        *(lengths.get(name, absent) for name in _LENGTH_NAMES),
        *(name in lengths for name in _LENGTH_NAMES),
        config.block_size_n,
        config.fixed_overhead_num_blocks,
        config.topk,
        config.extra_topk,
    )


def launch(plan: DecodingSchedPlan, tile_scheduler_metadata, num_splits, lengths) -> None:
    """The kernel ``plan`` names on admitted arguments (``lengths``: the length tensors given,
    by name), on the current stream."""
    module = load_module(MODULE, tile_scheduler_metadata.device.index)
    module.decoding_sched_meta(
        *kernel_arguments(tile_scheduler_metadata, num_splits, plan.config, lengths),
        plan.kernel is SchedKernel.IN_PLACE,
    )


def decoding_sched_meta(
    tile_scheduler_metadata: torch.Tensor,
    num_splits: torch.Tensor,
    config: DecodingSchedConfig,
    *,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    seqlens_k: torch.Tensor | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write FlashMLA's decoding schedule into the given buffers, in place; returns them.

    Args:
        tile_scheduler_metadata: int32 ``[num_sm_parts, 8]``, one record per partition.
        num_splits: int32 ``[batch_size + 1]``: ``num_splits[i]`` is request ``i``'s first row
            in the split accumulators, ``num_splits[batch_size] <= batch_size + num_sm_parts``.
        config: the schedule's scalars (:class:`DecodingSchedConfig`: ``topk``, ``extra_topk``,
            FlashMLA's block size and per-chunk overhead).
        topk_length: optional int32 ``[batch_size]``, valid indices per request (sparse mode;
            absent: every request has ``topk``). 0 counts as 1.
        extra_topk_length: optional int32 ``[batch_size]``, indices into the extra cache
            (absent: every request has ``extra_topk``).
        seqlens_k: int32 ``[batch_size]`` KV lengths, dense mode only (``topk == -1``).
        admission: this call's :func:`decoding_sched_meta_admission`, when the caller already
            made it; an admitted one is not validated again.
    """
    check_admission(admission)
    lengths = _present(topk_length, extra_topk_length, seqlens_k)
    if admission is None or not admission:
        config = _validate(tile_scheduler_metadata, num_splits, config, lengths)
        if admission is None:
            admission = _plan(tile_scheduler_metadata, num_splits, config, lengths)
    if admission:
        launch(admission.plan, tile_scheduler_metadata, num_splits, lengths)
        return tile_scheduler_metadata, num_splits
    metadata, splits = reference_sched_meta(
        batch_size=num_splits.shape[0] - 1,
        num_sm_parts=tile_scheduler_metadata.shape[0],
        **dataclasses.asdict(config),
        **lengths,
    )
    tile_scheduler_metadata.copy_(metadata)
    num_splits.copy_(splits)
    return tile_scheduler_metadata, num_splits


@dataclass
class DecodingSchedMeta:
    """The scheduler metadata of one decode step, FlashMLA-style, recomputed every step.

    The schedule depends on each step's lengths, so it must be recomputed inside the captured
    decode graph, once per step, and shared by every attention layer of that step. Use:

    - :meth:`schedule` at each layer: computes on the step's first call, then returns the same
      buffers;
    - :meth:`reset` at the start of every step, **and after the graph's warm-up run**: the
      warm-up leaves the schedule marked computed, and capturing then would record no
      scheduler launch at all, freezing the warm-up's schedule into every replay.

    The buffers are allocated once; their addresses never change, as graph replay requires.
    """

    tile_scheduler_metadata: torch.Tensor  # int32 [num_sm_parts, 8]: one record per partition
    num_splits: torch.Tensor  # int32 [batch_size + 1]: first split-accumulator row per request
    config: DecodingSchedConfig
    computed: bool = False  # whether this step's schedule is already in the buffers

    @classmethod
    def empty(
        cls,
        *,
        batch_size: int,
        num_sm_parts: int,
        device: torch.device | str,
        config: DecodingSchedConfig,
    ) -> DecodingSchedMeta:
        """Buffers for ``batch_size`` requests over ``num_sm_parts`` partitions."""
        batch_size = check_int("batch_size", batch_size, low=1)
        num_sm_parts = check_int("num_sm_parts", num_sm_parts, low=1)
        device, config = check_device("device", device), _checked_config(config)
        _fits_int32(config, batch_size, num_sm_parts)
        return cls(
            tile_scheduler_metadata=torch.empty(num_sm_parts, 8, dtype=torch.int32, device=device),
            num_splits=torch.empty(batch_size + 1, dtype=torch.int32, device=device),
            config=config,
        )

    def compute(
        self,
        *,
        topk_length: torch.Tensor | None = None,
        extra_topk_length: torch.Tensor | None = None,
        seqlens_k: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recompute the schedule into the buffers now (one launch on the current stream)."""
        decoding_sched_meta(
            self.tile_scheduler_metadata,
            self.num_splits,
            self.config,
            topk_length=topk_length,
            extra_topk_length=extra_topk_length,
            seqlens_k=seqlens_k,
        )
        self.computed = True
        return self.tile_scheduler_metadata, self.num_splits

    def schedule(
        self,
        *,
        topk_length: torch.Tensor | None = None,
        extra_topk_length: torch.Tensor | None = None,
        seqlens_k: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's schedule: computed on the step's first call (the lengths as
        :meth:`compute` takes them), reused afterwards."""
        if not self.computed:
            return self.compute(
                topk_length=topk_length, extra_topk_length=extra_topk_length, seqlens_k=seqlens_k
            )
        return self.tile_scheduler_metadata, self.num_splits

    def reset(self) -> None:
        """Mark the schedule stale: the next :meth:`schedule` recomputes (and is captured)."""
        self.computed = False

"""Row argmax over vocabulary-parallel logits, gathering one int64 per row and rank.

At tensor parallelism ``tp`` the vocabulary-parallel ``lm_head`` leaves each rank a
``[rows, vocab / tp]`` slice of the verify logits, and SGLang 0.5.23 all-gathers the whole
``[rows, vocab]`` on every rank before the greedy argmax: 3.1 MB at DSpark's six rows, TP4,
fp32, to produce six integers. Here each rank reduces its own slice to one 64-bit key per row,
the keys are all-gathered (8 bytes x rows x ranks) and a max over ranks picks the winner.

The key of a row is ``order(value) << 32 | (2**32 - 1 - global_index)``, from the shard's own
argmax (:func:`.row_argmax.row_argmax`, which is ``torch.argmax``'s first NaN or first
maximum): ``order`` maps fp32 to int32 increasing with the value, folds -0 onto +0 and puts
every NaN above +Inf (``argmax_reduction``'s order, the one its kernels merge lanes with), and
the low half makes the lower global index the larger key among equal values.

Contract: for shards that partition the vocabulary (each rank's ``vocab_start`` and width, in
any sizes, uneven or empty ones included, as long as one rank holds a column), the result on
every rank is **bitwise** ``torch.argmax(torch.cat(shards, dim=1), dim=-1)``. Why: without
NaN, each shard's key holds its first maximum, the max over keys takes the largest value and,
among shards tied on it, the lowest global index: the first maximum of the row. With NaN, the
row's first NaN is the first NaN of the first shard holding one, whose key wins over every
shard without NaN (NaN's order is the largest) and over every later shard with NaN (a larger
index). Global indices must be below 2**32; logits fp32, bf16 or fp16 (:data:`SHARD_DTYPES`).
A one-rank group holding no column is refused, as ``torch.argmax`` refuses an empty row
(:func:`validate_vocab`).

Concurrency and graph capture: each call borrows its own per-row scratch (local indices,
keys, gathered keys; up to :data:`MAX_ROWS` rows) from a free list of its device and stream, so
calls at once from several threads or streams never share one (:mod:`.shard_scratch`). Sets
are made on eager calls, so one eager call must come before capture; with ``out`` given a call
then allocates nothing and never syncs the host. The collective is ``torch.distributed``'s
all-gather on ``group`` (NCCL captures into a CUDA graph; gloo serves CPU tensors).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_int,
    check_tensor,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.interpreter import serialized
from dsv41_kernels.ops.speculative.argmax_plan import admit_logits, check_logits_dtype, check_values
from dsv41_kernels.ops.speculative.argmax_reduction import (
    EMPTY_SLOT,
    MAX_ROWS,
    decode_index,
    order_key,
)
from dsv41_kernels.ops.speculative.row_argmax import run_row_argmax
from dsv41_kernels.ops.speculative.shard_scratch import ScratchPool

MAX_INDEX = 2**32 - 1  # the low 32 bits of a key hold 2**32 - 1 - index
KEY_BLOCK = 128  # rows a program of the key and merge kernels
KEYS_KERNEL = "triton"  # the key and merge kernels, what Admission.kernel says

all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
"""``torch.distributed``'s all-gather into one tensor: torch 2.13 names it ``all_gather_single``
and deprecates ``all_gather_into_tensor``, the only name torch 2.11 (the H200's) has."""


SHARD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Dtypes whose values an fp32 order key holds exactly: float64 maxima closer than fp32
resolves would tie across ranks, and the lower index would win wrongly."""


def validate_shard(local_logits, vocab_start) -> int:
    """``vocab_start`` as an int; ValueError naming the argument unless ``local_logits`` is a
    2-D shard of :data:`SHARD_DTYPES` with values (empty rows allowed: a rank may hold no
    column) whose global indices fit below 2**32."""
    check_tensor("local_logits", local_logits, ndim=2)
    check_values("local_logits", local_logits)
    check_logits_dtype("local_logits", local_logits, SHARD_DTYPES, "the fp32 keys hold exactly")
    vocab_start = check_int("vocab_start", vocab_start)
    end = vocab_start + local_logits.shape[1]
    if vocab_start < 0 or end > MAX_INDEX + 1:
        raise ValueError(
            f"vocab_start must place the shard's columns in [0, 2**32), got columns "
            f"[{vocab_start}, {end})"
        )
    return vocab_start


def validate_vocab(local_logits, world: int) -> None:
    """ValueError naming ``local_logits`` when the group's one rank holds no column: the
    vocabulary is empty and ``torch.argmax`` would raise. With more ranks a rank cannot see
    that the others hold none (that takes reading the gathered keys, a host sync): the caller's
    shards must give some rank a column, else every row reads 2**32 - 1."""
    if world == 1 and local_logits.shape[1] == 0:
        raise ValueError(
            f"local_logits has no column on any rank (shape {tuple(local_logits.shape)}, a "
            f"group of one rank): the vocabulary is empty and argmax is undefined"
        )


def validate_group(group) -> int:
    """The world size of ``group``; TypeError unless it is a torch.distributed ProcessGroup,
    ValueError unless this process is one of its ranks."""
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group must be a torch.distributed.ProcessGroup (SGLang: the TP group's "
            f"device_group), got {type(group).__name__}"
        )
    world = dist.get_world_size(group)
    if world < 1:
        raise ValueError("group does not hold this process's rank")
    return world


def validate_index_out(name: str, out, rows: int, device: torch.device) -> None:
    if out is None:
        return
    check_tensor(name, out, dtypes=(torch.int64,), ndim=1)
    if out.shape[0] != rows or out.device != device or not out.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous int64 [{rows}] tensor on {device}, "
            f"got {tuple(out.shape)} on {out.device}"
        )


def validate_gathered(gathered_keys) -> None:
    check_tensor("gathered_keys", gathered_keys, dtypes=(torch.int64,), ndim=2)
    if gathered_keys.is_meta:
        raise ValueError("gathered_keys is a meta tensor: it holds no keys to merge")
    if not gathered_keys.is_contiguous():
        raise ValueError("gathered_keys must be contiguous [world, rows]")


def _validate(local_logits, vocab_start, group, out) -> tuple[int, int]:
    """``(vocab_start, world)``, validated."""
    vocab_start = validate_shard(local_logits, vocab_start)
    world = validate_group(group)
    validate_vocab(local_logits, world)
    validate_index_out("out", out, local_logits.shape[0], local_logits.device)
    return vocab_start, world


@dataclass(frozen=True)
class KeysPlan:
    """What the key and merge kernels run: the shard's own argmax (its
    :func:`.argmax_plan.admit_logits`, with the shard's plan; None where there is no shard or
    it has no column) and the rows a program."""

    argmax: Admission | None
    block: int = KEY_BLOCK


def admit_keys(t: torch.Tensor, rows: int, shard: torch.Tensor | None = None) -> Admission:
    """Whether the Triton key and merge kernels run for ``rows`` rows of ``t``'s device (the
    scratch holds :data:`MAX_ROWS`), with ``shard``'s own argmax planned too (a validated
    shard, or None); never raises, reads no values."""
    where = triton_device(t)
    if not where:
        return where
    if rows > MAX_ROWS:
        return refuse(f"{rows} rows > {MAX_ROWS}, the rows of a call's scratch")
    argmax = None
    if shard is not None and shard.shape[0] > 0 and shard.shape[1] > 0:
        argmax = admit_logits(shard)
    reason = f"{where.reason}, {rows} rows"
    if argmax is not None:
        reason += f"; the shard's argmax: {argmax.reason}"
    return admit(KEYS_KERNEL, reason, plan=KeysPlan(argmax))


def sharded_row_argmax_admission(
    local_logits: torch.Tensor, *, vocab_start: int, group, out: torch.Tensor | None = None
) -> Admission:
    """Whether the Triton key and merge kernels run (the shard's own argmax makes its choice
    in :func:`.row_argmax.row_argmax`); pure, never raises."""
    try:
        _validate(local_logits, vocab_start, group, out)
    except (TypeError, ValueError) as e:
        return invalid(e)
    return admit_keys(local_logits, local_logits.shape[0], local_logits)


@triton.jit
def shard_keys_kernel(
    logits_ptr,
    row_stride,
    col_stride,
    index_ptr,  # int64 [rows]: the shard's argmax
    keys_ptr,  # int64 [rows]
    rows,
    vocab_start,
    BLOCK: tl.constexpr,
):
    """``keys[r] = order(logits[r, index[r]]) << 32 | (2**32 - 1 - (vocab_start + index[r]))``."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    here = r < rows
    col = tl.load(index_ptr + r, mask=here, other=0)
    value = tl.load(logits_ptr + r.to(tl.int64) * row_stride + col * col_stride, mask=here)
    order = order_key(value.to(tl.float32)).to(tl.int64)
    tl.store(keys_ptr + r, (order << 32) | (4294967295 - (vocab_start + col)), mask=here)


@triton.jit
def merge_keys_kernel(gathered_ptr, world, rows, out_ptr, BLOCK: tl.constexpr):
    """``out[r]``: the index held by the largest of ``gathered[:, r]``."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    here = r < rows
    best = tl.full([BLOCK], -(2**63), tl.int64)
    for rank in range(world):
        keys = tl.load(gathered_ptr + rank * rows + r, mask=here, other=-(2**63))
        best = tl.maximum(best, keys)
    tl.store(out_ptr + r, decode_index(best), mask=here)


def order_key_torch(values: torch.Tensor) -> torch.Tensor:
    """The kernels' order in torch ops: int32 increasing with the value, -0 folded onto +0,
    every NaN above +Inf."""
    x = values.float()
    bits = torch.where(x == 0, 0.0, x).view(torch.int32)
    order = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return torch.where(x.isnan(), 0x7FFFFFFF, order)


def shard_keys_torch(local_logits, local_index, vocab_start, out) -> torch.Tensor:
    """:func:`shard_keys_kernel` in torch ops: the fallback, and its statement."""
    value = local_logits.gather(1, local_index[:, None]).squeeze(1)
    order = order_key_torch(value).to(torch.int64)
    return out.copy_((order << 32) | (MAX_INDEX - (vocab_start + local_index)))


def decode_keys_torch(keys: torch.Tensor) -> torch.Tensor:
    """The global index a key carries."""
    return MAX_INDEX - (keys & MAX_INDEX)


SCRATCH = ScratchPool("sharded_row_argmax", MAX_ROWS)
"""Each kernel-path call's own local indices, keys and gathered keys (:mod:`.shard_scratch`)."""


@contextlib.contextmanager
def call_scratch(device: torch.device, rows: int, world: int, admission: Admission):
    """``(local_index [rows], keys [rows], gathered [world, rows])``, this call's own while the
    block runs: views of a borrowed set on the kernel path, fresh tensors on the fallback
    (which also serves more rows)."""
    if not admission:
        yield (
            torch.empty(rows, dtype=torch.int64, device=device),
            torch.empty(rows, dtype=torch.int64, device=device),
            torch.empty(world, rows, dtype=torch.int64, device=device),
        )
        return
    with SCRATCH.borrow(device, world) as (index, keys, gathered):
        yield index[:rows], keys[:rows], gathered[: world * rows].view(world, rows)


def compute_keys(local_logits, vocab_start, index, keys, admission: Admission) -> torch.Tensor:
    """Each row's key into ``keys``, the shard's argmax through ``index`` (both ``[rows]``)."""
    rows, cols = local_logits.shape
    if rows == 0:
        return keys
    if cols == 0:  # a rank without columns loses every row
        return keys.fill_(EMPTY_SLOT)
    plan = admission.plan if admission else None
    argmax = plan.argmax if plan is not None else None
    run_row_argmax(local_logits, index, admit_logits(local_logits) if argmax is None else argmax)
    if not admission:
        return shard_keys_torch(local_logits, index, vocab_start, keys)
    with serialized():
        shard_keys_kernel[(triton.cdiv(rows, plan.block),)](
            local_logits,
            local_logits.stride(0),
            local_logits.stride(1),
            index,
            keys,
            rows,
            vocab_start,
            BLOCK=plan.block,
        )
    return keys


def shard_keys(
    local_logits: torch.Tensor,
    *,
    vocab_start: int,
    out: torch.Tensor | None = None,
    admission: Admission | None = None,
) -> torch.Tensor:
    """One rank's int64 ``[rows]`` keys for ``local_logits`` ``[rows, w]``, the columns
    ``vocab_start .. vocab_start + w - 1`` of the vocabulary (the first half of
    :func:`sharded_row_argmax`, for callers that merge the keys themselves).

    ``out`` (int64 ``[rows]``, contiguous) is written in place. ``admission``: this call's
    :func:`admit_keys`, when the caller already made it.
    """
    check_admission(admission)
    vocab_start = validate_shard(local_logits, vocab_start)
    rows, device = local_logits.shape[0], local_logits.device
    validate_index_out("out", out, rows, device)
    if admission is None:
        admission = admit_keys(local_logits, rows, local_logits)
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=device)
    with call_scratch(device, rows, 0, admission) as (index, _, _):
        return compute_keys(local_logits, vocab_start, index, out, admission)


def merge_into(gathered: torch.Tensor, out: torch.Tensor, admission: Admission) -> torch.Tensor:
    world, rows = gathered.shape
    if rows == 0:
        return out
    if not admission:
        return out.copy_(decode_keys_torch(gathered.amax(dim=0)))
    with serialized():
        block = admission.plan.block
        merge_keys_kernel[(triton.cdiv(rows, block),)](gathered, world, rows, out, BLOCK=block)
    return out


def merge_keys(
    gathered_keys: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    admission: Admission | None = None,
) -> torch.Tensor:
    """The int64 ``[rows]`` global argmax from every rank's keys, ``gathered_keys``
    (int64 ``[world, rows]``, contiguous); ``out`` (int64 ``[rows]``) is written in place."""
    check_admission(admission)
    validate_gathered(gathered_keys)
    rows = gathered_keys.shape[1]
    validate_index_out("out", out, rows, gathered_keys.device)
    if admission is None:
        admission = admit_keys(gathered_keys, rows)
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=gathered_keys.device)
    return merge_into(gathered_keys, out, admission)


@contextlib.contextmanager
def gather_keys(local_logits, vocab_start, group, world: int, admission: Admission):
    """Every rank's keys, ``[world, rows]``: this rank's, all-gathered over ``group``, in this
    call's own scratch while the block runs."""
    rows = local_logits.shape[0]
    with call_scratch(local_logits.device, rows, world, admission) as (index, keys, gathered):
        compute_keys(local_logits, vocab_start, index, keys, admission)
        all_gather_into(gathered.view(-1), keys, group=group)
        yield gathered


def sharded_row_argmax(
    local_logits: torch.Tensor,
    *,
    vocab_start: int,
    group,
    out: torch.Tensor | None = None,
    admission: Admission | None = None,
) -> torch.Tensor:
    """``torch.argmax`` over the vocabulary-parallel rows whose columns ``vocab_start ..
    vocab_start + w - 1`` this rank holds as ``local_logits`` ``[rows, w]``; int64 ``[rows]``,
    the same on every rank of ``group``.

    Every rank of ``group`` (a ``torch.distributed`` ProcessGroup: NCCL for CUDA tensors,
    gloo for CPU ones) calls it with the same ``rows`` and its own shard; strides are read from
    the tensor (a column slice of a wider buffer is fine). ``out`` (int64 ``[rows]``,
    contiguous) is written in place. ``admission``: this call's
    :func:`sharded_row_argmax_admission`, when the caller already made it.
    """
    check_admission(admission)
    vocab_start, world = _validate(local_logits, vocab_start, group, out)
    rows, device = local_logits.shape[0], local_logits.device
    if admission is None:
        admission = admit_keys(local_logits, rows, local_logits)
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=device)
    if rows == 0:
        return out
    with gather_keys(local_logits, vocab_start, group, world, admission) as gathered:
        return merge_into(gathered, out, admission)

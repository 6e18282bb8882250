"""FlashMLA's split-KV decoding schedule, stated in plain Python (docs/specs.md section A).

FlashMLA's decode kernels give each of ``num_sm_parts`` persistent partitions an even share of
the batch's KV blocks; every request also costs ``fixed_overhead_num_blocks`` per chunk it is
cut into. This module restates how FlashMLA computes that schedule, byte for byte, as the
schedulers of sgl-flash-mla 1.0.0 (the FlashMLA SGLang 0.5.23 runs, legacy and current) write
it, including the partitions that find no work (see :func:`decoding_sched_meta`). All
arithmetic is C ``int`` arithmetic: division truncates toward zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

RECORD_FIELDS = (
    "begin_req_idx",  # first request of the partition (inclusive)
    "end_req_idx",  # last request of the partition (inclusive)
    "begin_block_idx",  # first block of the first request (inclusive)
    "end_block_idx",  # end block of the last request (exclusive)
    "begin_split_idx",  # which chunk of the first request this partition computes
    "is_first_req_splitted",  # 1 when the first request's output goes to the split accumulator
    "is_last_req_splitted",  # 1 when the last request's output goes to the split accumulator
    "_pad",  # never read; FlashMLA leaves it uninitialised, written as 0 here
)


def _c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero), as FlashMLA's ``int`` arithmetic does."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _values(name: str, lengths, batch_size: int) -> list[int] | None:
    if lengths is None:
        return None
    values = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
    if len(values) != batch_size:
        raise ValueError(f"{name} must hold batch_size={batch_size} values, got {len(values)}")
    return [int(v) for v in values]


def request_tokens(
    i: int,
    *,
    block_size_n: int,
    topk: int,
    extra_topk: int,
    topk_length: Sequence[int] | None,
    extra_topk_length: Sequence[int] | None,
    seqlens_k: Sequence[int] | None,
) -> int:
    """Tokens request ``i`` attends to, as FlashMLA counts them (docs/specs.md A.3)."""
    if topk == -1:  # dense decode: the KV cache length
        return seqlens_k[i]
    tokens = topk_length[i] if topk_length is not None else topk
    if tokens == 0:  # the main loop is never empty: a request always has a first block
        tokens = 1
    if extra_topk != 0:
        # The main part is rounded up to a whole block first; the extra part is not.
        tokens = _c_div(tokens + block_size_n - 1, block_size_n) * block_size_n
        tokens += extra_topk_length[i] if extra_topk_length is not None else extra_topk
    return tokens


def decoding_sched_meta(
    *,
    batch_size: int,
    num_sm_parts: int,
    block_size_n: int = 64,
    fixed_overhead_num_blocks: int = 5,
    topk: int,
    extra_topk: int = 0,
    topk_length=None,
    extra_topk_length=None,
    seqlens_k=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's tile-scheduler metadata and split prefix sums for one decode step.

    Sparse decode when ``topk > 0`` (``topk_length``/``extra_topk_length``: optional
    per-request lengths, lists or tensors of ``batch_size`` ints), dense decode when
    ``topk == -1`` (``seqlens_k`` required). Returns ``tile_scheduler_metadata`` int32
    ``[num_sm_parts, 8]`` (fields: :data:`RECORD_FIELDS`) and ``num_splits`` int32
    ``[batch_size + 1]`` on the CPU.

    The partitions left over once every request is scheduled all carry
    ``begin_req_idx = batch_size`` (consumers skip them) and ``begin_block_idx = 0``, the
    walk's block position there, as sgl-flash-mla 1.0.0's schedulers write it (an earlier
    FlashMLA scheduler read one past an array there and wrote the first request's last
    block; nothing SGLang 0.5.23 runs does).
    """
    if batch_size < 1 or num_sm_parts < 1 or block_size_n < 1:
        raise ValueError("batch_size, num_sm_parts and block_size_n must be positive")
    if topk == -1 and seqlens_k is None:
        raise ValueError("seqlens_k is required in dense mode (topk == -1)")
    b, parts, overhead = batch_size, num_sm_parts, fixed_overhead_num_blocks
    lengths = {
        "topk_length": _values("topk_length", topk_length, b),
        "extra_topk_length": _values("extra_topk_length", extra_topk_length, b),
        "seqlens_k": _values("seqlens_k", seqlens_k, b),
    }

    tokens, last_block, num_blocks = [], [], []
    for i in range(b):
        s = request_tokens(
            i, block_size_n=block_size_n, topk=topk, extra_topk=extra_topk, **lengths
        )
        tokens.append(s)
        last_block.append(max(s - 1, 0) // block_size_n)
        num_blocks.append(last_block[-1] + 1)
    total = sum(n + overhead for n in num_blocks)
    payload = _c_div(total + parts - 1, parts) + overhead

    records, num_splits = [], [0] * (b + 1)
    req = blk = nsplit = cum = 0
    for _ in range(parts):
        begin_req, begin_block, begin_split = req, blk, nsplit
        first_split = int(blk != 0)
        rem = payload
        while req < b:
            left = num_blocks[req] - blk
            if rem >= left + overhead:  # the rest of this request fits
                cum += nsplit + 1
                num_splits[req + 1] = cum
                rem -= left + overhead
                req, blk, nsplit = req + 1, 0, 0
            else:
                if rem - overhead > 0:  # room for at least one block: cut the request
                    blk += rem - overhead
                    nsplit += 1
                break
        if blk > 0:  # stopped inside request `req`
            end_req, end_block = req, blk
        else:  # stopped on a request boundary
            end_req = req - 1
            end_block = 0 if tokens[end_req] == 0 else last_block[end_req] + 1
        last_split = int(end_block != last_block[end_req] + 1 and tokens[end_req] != 0)
        if begin_req == end_req:
            first_split = last_split = int(first_split or last_split)
        records.append(
            [begin_req, end_req, begin_block, end_block, begin_split, first_split, last_split, 0]
        )
    if not (req == b and blk == 0 and nsplit == 0):
        raise ValueError("the walk did not schedule every block (int32 overflow in the lengths?)")
    return (
        torch.tensor(records, dtype=torch.int32).reshape(parts, 8),
        torch.tensor(num_splits, dtype=torch.int32),
    )

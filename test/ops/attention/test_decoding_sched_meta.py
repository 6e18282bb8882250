"""FlashMLA's decoding scheduler: the reference against the spec, the kernels against both."""

import dataclasses
import random

import numpy as np
import pytest
import torch

from dsv41_kernels.admission import admit
from dsv41_kernels.cases.decoding_sched_meta import baseline_decoding_sched_meta, check_cases
from dsv41_kernels.ops.attention.decoding_sched_meta import (
    BLOCK_SIZE_N,
    FIXED_OVERHEAD_NUM_BLOCKS,
    MODULE,
    STAGING_LIMIT_BYTES,
    DecodingSchedConfig,
    DecodingSchedMeta,
    DecodingSchedPlan,
    SchedKernel,
    decoding_sched_meta,
    decoding_sched_meta_admission,
    device_sched_config,
    fixed_overhead_num_blocks,
    num_sm_parts,
    staged_bytes,
)
from dsv41_kernels.reference.decoding_sched_meta import decoding_sched_meta as reference
from dsv41_kernels.reference.decoding_sched_meta import request_tokens
from test.machine import on_cuda, pretend_toolchain


def as_tensors(meta, splits):
    return torch.tensor(meta, dtype=torch.int32), torch.tensor(splits, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# CPU tier: the reference


SPEC_VECTORS = [  # docs/specs.md A.12
    (
        dict(batch_size=1, num_sm_parts=132, topk=2048),
        [[0, 0, k, k + 1, k, 1, 1, 0] for k in range(32)] + [[1, 0, 0, 32, 0, 0, 0, 0]] * 100,
        [0, 32],
    ),
    (
        dict(
            batch_size=4,
            num_sm_parts=8,
            topk=512,
            extra_topk=128,
            topk_length=[512, 100, 0, 300],
            extra_topk_length=[128, 0, 64, 128],
        ),
        [[0, 0, 0, 6, 0, 1, 1, 0], [0, 0, 6, 10, 1, 1, 1, 0], [1, 1, 0, 2, 0, 0, 0, 0]]
        + [[2, 2, 0, 2, 0, 0, 0, 0], [3, 3, 0, 6, 0, 1, 1, 0], [3, 3, 6, 7, 1, 1, 1, 0]]
        + [[4, 3, 0, 7, 0, 0, 0, 0]] * 2,
        [0, 2, 3, 4, 6],
    ),
    (
        dict(batch_size=2, num_sm_parts=6, topk=2048, fixed_overhead_num_blocks=3),
        [[0, 0, 0, 12, 0, 1, 1, 0], [0, 0, 12, 24, 1, 1, 1, 0], [0, 1, 24, 1, 2, 1, 1, 0]]
        + [[1, 1, 1, 13, 1, 1, 1, 0], [1, 1, 13, 25, 2, 1, 1, 0], [1, 1, 25, 32, 3, 1, 1, 0]],
        [0, 3, 7],
    ),
    (
        dict(batch_size=3, num_sm_parts=8, topk=-1, seqlens_k=[0, 1000, 65]),
        [[0, 0, 0, 0, 0, 0, 0, 0], [1, 1, 0, 5, 0, 1, 1, 0], [1, 1, 5, 10, 1, 1, 1, 0]]
        + [[1, 1, 10, 15, 2, 1, 1, 0], [1, 1, 15, 16, 3, 1, 1, 0], [2, 2, 0, 2, 0, 0, 0, 0]]
        + [[3, 2, 0, 2, 0, 0, 0, 0]] * 2,
        [0, 1, 5, 6],
    ),
]


@pytest.mark.parametrize("kwargs, meta, splits", SPEC_VECTORS, ids=["a", "b", "c", "dense"])
def test_reference_spec_vectors(kwargs, meta, splits):
    got_meta, got_splits = reference(**kwargs)
    want_meta, want_splits = as_tensors(meta, splits)
    assert got_meta.dtype == got_splits.dtype == torch.int32
    assert torch.equal(got_meta, want_meta)
    assert torch.equal(got_splits, want_splits)


def test_reference_takes_tensors_and_lists():
    kwargs, meta, splits = SPEC_VECTORS[1]
    as_tensor = {
        k: torch.tensor(v, dtype=torch.int32) if isinstance(v, list) else v
        for k, v in kwargs.items()
    }
    got = reference(**as_tensor)
    assert all(torch.equal(a, b) for a, b in zip(got, as_tensors(meta, splits), strict=True))


def test_reference_rounds_with_c_division():
    # rup(-100, 64) is 0 in C (truncation), -64 with floor division: 128 tokens, 2 blocks.
    meta, _ = reference(batch_size=1, num_sm_parts=1, topk=512, extra_topk=128, topk_length=[-100])
    assert meta[0].tolist() == [0, 0, 0, 2, 0, 0, 0, 0]
    # Without an extra part a negative length is one block; 0 counts as 1 token, one block.
    for length in (-100, 0):
        meta, _ = reference(batch_size=1, num_sm_parts=1, topk=512, topk_length=[length])
        assert meta[0].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]


def random_case(rng: random.Random) -> dict:
    b = rng.choice([1, 2, 3, rng.randrange(1, 17), rng.randrange(1, 65)])
    parts = rng.choice([1, 2, 3, 7, 22, 25, 74, 132, 152, rng.randrange(1, 200)])
    case = dict(
        batch_size=b,
        num_sm_parts=parts,
        block_size_n=rng.choice([64, 64, 16, 1]),
        fixed_overhead_num_blocks=rng.choice([5, 3, 0, 1]),
    )
    if rng.random() < 0.2:
        case.update(
            topk=-1, seqlens_k=[rng.choice([0, 1, 64, rng.randrange(20000)]) for _ in range(b)]
        )
        return case
    topk = rng.choice([1, 64, 512, 2048, rng.randrange(1, 5000)])
    extra = rng.choice([0, 0, 64, 512, rng.randrange(0, 1000)])
    case.update(topk=topk, extra_topk=extra)
    if rng.random() < 0.8:
        case["topk_length"] = [rng.choice([0, 1, topk, rng.randrange(topk + 1)]) for _ in range(b)]
    if extra and rng.random() < 0.7:
        case["extra_topk_length"] = [
            rng.choice([0, 1, extra, rng.randrange(extra + 1)]) for _ in range(b)
        ]
    return case


def check_invariants(case: dict, meta: torch.Tensor, splits: torch.Tensor) -> None:
    """What FlashMLA's consumers rely on (docs/specs.md A.6, A.9), from the outputs alone."""
    b, parts = case["batch_size"], case["num_sm_parts"]
    lengths = {k: case.get(k) for k in ("topk_length", "extra_topk_length", "seqlens_k")}
    scalars = dict(topk=case["topk"], extra_topk=case.get("extra_topk", 0))
    tokens = [
        request_tokens(i, block_size_n=case["block_size_n"], **scalars, **lengths) for i in range(b)
    ]
    # Blocks a consumer iterates: an empty dense request has none.
    blocks = [0 if s == 0 else (s - 1) // case["block_size_n"] + 1 for s in tokens]
    records, ns = meta.tolist(), splits.tolist()
    assert ns[0] == 0 and ns[b] <= b + parts
    chunks = [[] for _ in range(b)]  # (first block, end block, split flag, accumulator row)
    begins = [rec[0] for rec in records]
    assert begins == sorted(begins)
    for br, er, bb, eb, bs, fs, ls, pad in records:
        assert pad == 0 and fs in (0, 1) and ls in (0, 1)
        if br >= b:  # left over: skipped by every consumer
            assert (br, er, bs, fs, ls) == (b, b - 1, 0, 0, 0)
            continue
        assert br <= er < b
        if br == er:
            assert fs == ls
        for i in range(br, er + 1):
            start = bb if i == br else 0
            end = eb if i == er else blocks[i]
            split = fs if i == br else ls if i == er else 0
            chunks[i].append((start, end, split, ns[i] + (bs if i == br else 0)))
    for i in range(b):
        got = chunks[i]
        assert got, f"request {i} is in no partition"
        assert ns[i + 1] - ns[i] == len(got), f"request {i}: num_splits vs chunks"
        # Every block exactly once, in order; only an empty dense request has an empty range.
        assert got[0][0] == 0 and got[-1][1] == blocks[i]
        for (_, end, _, _), (start, _, _, _) in zip(got, got[1:], strict=False):
            assert end == start
        assert all(start < end for start, end, _, _ in got) or blocks[i] == 0
        # Split flags say whether the request was cut; each chunk gets its own accumulator row.
        assert all(split == (len(got) > 1) for _, _, split, _ in got)
        if len(got) > 1:
            assert [row for *_, row in got] == list(range(ns[i], ns[i + 1]))


def test_reference_invariants_random():
    rng = random.Random(2024)
    for _ in range(3000):
        case = random_case(rng)
        meta, splits = reference(**case)
        assert meta.shape == (case["num_sm_parts"], 8) and splits.shape == (case["batch_size"] + 1,)
        check_invariants(case, meta, splits)


# ---------------------------------------------------------------------------------------------
# CPU tier: configuration, admission, errors, fallback


def test_num_sm_parts_table():
    sm90 = dict(arch_major=9)
    assert num_sm_parts(num_sms=132, s_q=1, h_q=64, **sm90) == 132
    assert num_sm_parts(num_sms=132, s_q=6, h_q=64, **sm90) == 22
    assert num_sm_parts(num_sms=132, s_q=6, h_q=128, **sm90) == 11
    assert num_sm_parts(num_sms=132, s_q=200, h_q=64, **sm90) == 1
    sm100 = dict(arch_major=10)
    assert num_sm_parts(num_sms=148, s_q=1, h_q=64, **sm100) == 148
    assert num_sm_parts(num_sms=152, s_q=1, h_q=64, **sm100) == 152
    assert num_sm_parts(num_sms=148, s_q=6, h_q=64, **sm100) == 24
    assert num_sm_parts(num_sms=152, s_q=6, h_q=64, **sm100) == 25
    assert num_sm_parts(num_sms=152, s_q=1, h_q=128, d_qk=576, **sm100) == 152
    assert num_sm_parts(num_sms=152, s_q=1, h_q=128, d_qk=512, **sm100) == 76
    assert num_sm_parts(num_sms=152, s_q=6, h_q=128, d_qk=512, **sm100) == 12
    assert fixed_overhead_num_blocks(arch_major=10, h_q=128, d_qk=512) == 3
    assert fixed_overhead_num_blocks(arch_major=10, h_q=128, d_qk=576) == 5
    assert fixed_overhead_num_blocks(arch_major=9, h_q=128) == FIXED_OVERHEAD_NUM_BLOCKS == 5
    assert BLOCK_SIZE_N == 64
    for bad in (
        dict(arch_major=8, h_q=64),
        dict(arch_major=12, h_q=64),
        dict(arch_major=9, h_q=32),
    ):
        with pytest.raises(ValueError):
            num_sm_parts(num_sms=132, s_q=1, **bad)
    with pytest.raises(ValueError, match="d_qk"):
        num_sm_parts(num_sms=132, s_q=1, h_q=64, arch_major=9, d_qk=128)
    with pytest.raises(ValueError, match="s_q"):
        num_sm_parts(num_sms=132, s_q=0, h_q=64, arch_major=9)


def outputs(b: int, parts: int, device="cpu"):
    return (
        torch.full((parts, 8), -7, dtype=torch.int32, device=device),
        torch.full((b + 1,), -7, dtype=torch.int32, device=device),
    )


SPARSE = dict(block_size_n=64, fixed_overhead_num_blocks=5, topk=2048, extra_topk=512)
SPARSE_CONFIG = DecodingSchedConfig(**SPARSE)
CONFIG_FIELDS = {f.name for f in dataclasses.fields(DecodingSchedConfig)}


def config_and_rest(kwargs: dict) -> tuple[DecodingSchedConfig, dict]:
    """The reference's flat keywords split into the op's config and its other arguments."""
    config = DecodingSchedConfig(**{k: v for k, v in kwargs.items() if k in CONFIG_FIELDS})
    return config, {k: v for k, v in kwargs.items() if k not in CONFIG_FIELDS}


def test_admission_refuses_cpu():
    meta, splits = outputs(4, 22)
    got = decoding_sched_meta_admission(meta, splits, SPARSE_CONFIG)
    assert not got and got.path == "fallback" and "cpu" in got.reason and got.kernel is None


@pytest.mark.parametrize(
    "change, name",
    [
        (
            dict(tile_scheduler_metadata=torch.zeros(22, 8, dtype=torch.int64)),
            "tile_scheduler_metadata",
        ),
        (
            dict(tile_scheduler_metadata=torch.zeros(22, 7, dtype=torch.int32)),
            "tile_scheduler_metadata",
        ),
        (dict(num_splits=torch.zeros(1, dtype=torch.int32)), "num_splits"),
        (dict(num_splits=torch.zeros(5, 1, dtype=torch.int32)), "num_splits"),
        (dict(topk_length=torch.zeros(4, dtype=torch.int64)), "topk_length"),
        (dict(topk_length=torch.zeros(5, dtype=torch.int32)), "topk_length"),
        (dict(extra_topk_length=torch.zeros(4, 1, dtype=torch.int32)), "extra_topk_length"),
        (dict(seqlens_k=torch.zeros(4, dtype=torch.int32)), "seqlens_k"),
        (dict(block_size_n=0), "block_size_n"),
        (dict(fixed_overhead_num_blocks=-1), "fixed_overhead_num_blocks"),
        (dict(topk=0), "topk"),
        (dict(topk=-2), "topk"),
        (dict(extra_topk=-1), "extra_topk"),
        (dict(topk=-1, extra_topk=0), "seqlens_k"),
        (dict(topk=-1, topk_length=torch.zeros(4, dtype=torch.int32)), "topk_length"),
    ],
)
def test_bad_arguments_raise(change, name):
    meta, splits = outputs(4, 22)
    flat = dict(tile_scheduler_metadata=meta, num_splits=splits, **SPARSE) | change
    config, args = config_and_rest(flat)
    buffers = (args.pop("tile_scheduler_metadata"), args.pop("num_splits"))
    for fn in (decoding_sched_meta, baseline_decoding_sched_meta):
        with pytest.raises(ValueError, match=name):
            fn(*buffers, config, **args)
    verdict = decoding_sched_meta_admission(*buffers, config, **args)  # refuses, never raises
    assert not verdict and name in verdict.reason and verdict.reason.startswith("invalid")


INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    "fields, b, parts, names",
    [
        # The main part rounded up to a whole block: topk + block_size_n - 1.
        (dict(topk=INT32_MAX, extra_topk=INT32_MAX), 1, 1, ("topk", "block_size_n")),
        (dict(topk=INT32_MAX, extra_topk=1, block_size_n=1), 1, 1, ("topk", "extra_topk")),
        # That rounded part plus the extra part.
        (dict(topk=2**31 - 64, extra_topk=64), 1, 1, ("topk", "extra_topk")),
        # The batch's cost: batch_size * (blocks a request + the overhead).
        (dict(topk=2**30, block_size_n=1), 2, 1, ("batch_size", "fixed_overhead_num_blocks")),
        (dict(topk=1, fixed_overhead_num_blocks=INT32_MAX), 1, 1, ("fixed_overhead_num_blocks",)),
        (dict(topk=-1, fixed_overhead_num_blocks=2**30), 2, 1, ("batch_size",)),
        # The cost rounded up over the partitions, and the payload (that plus the overhead).
        (
            dict(topk=INT32_MAX, block_size_n=1, fixed_overhead_num_blocks=0),
            1,
            2,
            ("num_sm_parts",),
        ),
        (dict(topk=1, fixed_overhead_num_blocks=2**30), 1, 1, ("payload",)),
    ],
)
def test_fields_that_overflow_int32_together_are_refused(fields, b, parts, names):
    """Each field fits int32, their sum or product in the kernels does not: a ValueError naming
    the fields, from the op (either path), its admission and the holder, before any launch."""
    config = DecodingSchedConfig(**{"topk": 1} | fields)
    for where in ("cpu", "cuda"):  # the fallback's call, and the kernel's (its admission)
        meta, splits = outputs(b, parts)
        if where == "cuda":
            meta, splits = on_cuda(meta), on_cuda(splits)
        lengths = {"seqlens_k": torch.ones(b, dtype=torch.int32)} if config.topk == -1 else {}
        verdict = decoding_sched_meta_admission(meta, splits, config, **lengths)
        assert not verdict and "overflows int32" in verdict.reason
        assert all(name in verdict.reason for name in names), verdict.reason
    with pytest.raises(ValueError, match="overflows int32") as raised:
        decoding_sched_meta(*outputs(b, parts), config, **lengths)
    assert all(name in str(raised.value) for name in names), raised.value
    with pytest.raises(ValueError, match="overflows int32"):
        DecodingSchedMeta.empty(batch_size=b, num_sm_parts=parts, device="cpu", config=config)


def test_fields_at_the_int32_edge_are_taken():
    """The largest sums that fit: the reference schedules them (the kernels' int32 holds)."""
    config = DecodingSchedConfig(topk=2**31 - 64 - 63, extra_topk=63, fixed_overhead_num_blocks=0)
    meta, splits = decoding_sched_meta(*outputs(1, 1), config)
    assert splits.tolist() == [0, 1] and meta[0, :4].tolist() == [0, 0, 0, 2**25]


def test_overlapping_outputs_are_refused():
    """The schedule's two buffers are outputs: neither may address one element twice, and they
    may not share memory (the in-place kernel stages in num_splits)."""
    meta, splits = outputs(4, 22)
    for args, match in (
        ((meta[:1].expand(22, 8), splits), "^tile_scheduler_metadata has overlapping"),
        ((meta, splits[:1].expand(5)), "^num_splits has overlapping"),
        ((meta, meta.view(-1)[:5]), "tile_scheduler_metadata and num_splits share memory"),
    ):
        with pytest.raises(ValueError, match=match):
            decoding_sched_meta(*args, SPARSE_CONFIG)
        assert not decoding_sched_meta_admission(*args, SPARSE_CONFIG)


def test_lengths_sharing_memory_with_an_output_are_refused():
    """A length tensor the kernel reads while it writes the schedule into the same memory would
    give garbage on the GPU (the fallback reads first): refused on every path, naming it."""
    meta, _ = outputs(4, 6)
    backing = torch.zeros(8, dtype=torch.int32)
    splits = backing[:7]
    for name in ("topk_length", "extra_topk_length"):
        kwargs = {name: backing[1:7]}
        config = DecodingSchedConfig(topk=512, extra_topk=64 if name == "extra_topk_length" else 0)
        with pytest.raises(ValueError, match=f"^{name} shares memory with the output num_splits"):
            decoding_sched_meta(meta, splits, config, **kwargs)
        assert not decoding_sched_meta_admission(meta, splits, config, **kwargs)
    apart = torch.full((6,), 100, dtype=torch.int32)
    decoding_sched_meta(meta, splits, DecodingSchedConfig(topk=512), topk_length=apart)


def test_schedule_takes_only_the_lengths():
    """An unknown keyword raises TypeError on every call, not only the step's first."""
    sched = DecodingSchedMeta.empty(
        batch_size=2, num_sm_parts=6, device="cpu", config=DecodingSchedConfig(topk=512)
    )
    with pytest.raises(TypeError, match="bogus"):
        sched.schedule(bogus=1)
    sched.schedule()
    assert sched.computed
    with pytest.raises(TypeError, match="bogus"):
        sched.schedule(bogus=1)


def test_admission_must_be_an_admission():
    with pytest.raises(TypeError, match="^admission must be an Admission"):
        decoding_sched_meta(*outputs(4, 22), SPARSE_CONFIG, admission="kernel")


def test_baseline_needs_cuda():
    with pytest.raises(ValueError, match="kernel path"):
        baseline_decoding_sched_meta(*outputs(4, 22), SPARSE_CONFIG)


def test_config_must_be_a_decoding_sched_config():
    with pytest.raises(ValueError, match="config"):
        decoding_sched_meta(*outputs(4, 22), SPARSE)


def test_fallback_matches_reference():
    rng = random.Random(7)
    for _ in range(60):
        case = random_case(rng)
        b, parts = case.pop("batch_size"), case.pop("num_sm_parts")
        lengths = ("topk_length", "extra_topk_length", "seqlens_k")
        tensors = {
            k: torch.tensor(v, dtype=torch.int32) if k in lengths else v for k, v in case.items()
        }
        config, lengths = config_and_rest(tensors)
        meta, splits = decoding_sched_meta(*outputs(b, parts), config, **lengths)
        want = reference(batch_size=b, num_sm_parts=parts, **case)
        assert torch.equal(meta, want[0]) and torch.equal(splits, want[1])


def test_holder_recomputes_after_reset():
    sched = DecodingSchedMeta.empty(
        batch_size=2, num_sm_parts=6, device="cpu", config=DecodingSchedConfig(topk=512)
    )
    lengths = torch.tensor([512, 100], dtype=torch.int32)
    meta, splits = sched.schedule(topk_length=lengths)
    want = reference(batch_size=2, num_sm_parts=6, topk=512, topk_length=lengths)
    assert sched.computed and torch.equal(meta, want[0]) and torch.equal(splits, want[1])
    lengths.fill_(0)
    sched.schedule(topk_length=lengths)  # same step: reused, not recomputed
    assert torch.equal(sched.tile_scheduler_metadata, want[0])
    sched.reset()
    assert not sched.computed
    sched.schedule(topk_length=lengths)
    want = reference(batch_size=2, num_sm_parts=6, topk=512, topk_length=lengths)
    assert torch.equal(sched.tile_scheduler_metadata, want[0])
    assert torch.equal(sched.num_splits, want[1])


def test_check_cases_cpu():
    from dsv41_kernels.check import run_case

    records = [run_case(c, timed=False) for c in check_cases(torch.device("cpu"), small=True)]
    assert records and all(r["exact"] and r["path"] == "fallback" for r in records)


# ---------------------------------------------------------------------------------------------
# GPU tier: block-parallel == baseline == reference, bit for bit


def length_shapes(rng: random.Random, b: int, topk: int) -> dict[str, list[int]]:
    return {
        "zero": [0] * b,
        "one": [1] * b,
        "random": [rng.randrange(topk + 1) for _ in range(b)],
        "full": [topk] * b,
        "mixed": [rng.choice([0, 1, topk, rng.randrange(topk + 1)]) for _ in range(b)],
    }


def in_place(meta, splits, config, **lengths):
    """The op with the walk in place forced, whatever the batch size."""
    plan = DecodingSchedPlan(SchedKernel.IN_PLACE, config)
    forced = admit(SchedKernel.IN_PLACE.value, "forced by the test", MODULE, plan)
    return decoding_sched_meta(meta, splits, config, **lengths, admission=forced)


def run_all_three(case: dict, *, baseline: bool = True) -> None:
    """Ours (the admission's kernel, then the walk in place) and the baseline, into buffers
    holding -7, against the reference, all 8 fields."""
    device = torch.device("cuda")
    b, parts = case["batch_size"], case["num_sm_parts"]
    kwargs = {k: v for k, v in case.items() if k not in ("batch_size", "num_sm_parts")}
    config, lengths = config_and_rest(kwargs)
    on_device = {k: torch.tensor(v, dtype=torch.int32, device=device) for k, v in lengths.items()}
    want_meta, want_splits = reference(batch_size=b, num_sm_parts=parts, **kwargs)
    arms = [decoding_sched_meta, in_place] + ([baseline_decoding_sched_meta] if baseline else [])
    for fn in arms:
        meta, splits = outputs(b, parts, device)
        assert decoding_sched_meta_admission(meta, splits, config, **on_device)
        fn(meta, splits, config, **on_device)
        label = f"{fn.__name__} b={b} parts={parts} {kwargs.get('topk')}"
        assert torch.equal(meta.cpu(), want_meta), label
        assert torch.equal(splits.cpu(), want_splits), label


# (num_sm_parts, fixed overhead): H200 at s_q 1 and 6, B200/GB300 at s_q 1 and 6, SM100 head 128.
PARTITIONS = [(132, 5), (22, 5), (148, 5), (152, 5), (24, 5), (25, 5), (76, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("parts, overhead", PARTITIONS)
@pytest.mark.parametrize("topk", [512, 2048])
def test_gpu_sparse_batches_1_to_64(parts, overhead, topk):
    rng = random.Random(parts * topk)
    for b in range(1, 65):
        for shape, topk_length in length_shapes(rng, b, topk).items():
            for extra in (0, 512):
                case = dict(
                    batch_size=b,
                    num_sm_parts=parts,
                    block_size_n=64,
                    fixed_overhead_num_blocks=overhead,
                    topk=topk,
                    extra_topk=extra,
                    topk_length=topk_length,
                )
                if extra and shape != "full":  # "full" also covers an absent extra_topk_length
                    case["extra_topk_length"] = [rng.randrange(extra + 1) for _ in range(b)]
                run_all_three(case)
        # No per-request lengths at all: every request has topk (+ extra_topk).
        run_all_three(
            dict(batch_size=b, num_sm_parts=parts, fixed_overhead_num_blocks=overhead, topk=topk)
            | dict(block_size_n=64, extra_topk=rng.choice([0, 128]))
        )


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [132, 22, 152])
def test_gpu_dense(parts):
    rng = random.Random(parts)
    for b in range(1, 65):
        seqlens = [rng.choice([0, 1, 64, 65, rng.randrange(100000)]) for _ in range(b)]
        case = dict(batch_size=b, num_sm_parts=parts, block_size_n=64, topk=-1, seqlens_k=seqlens)
        run_all_three(case | dict(fixed_overhead_num_blocks=5))


# Largest batch whose staging fits the kernel's 48 KB of shared memory (see the .cu): the
# staging is 48 + 4 * (3b + 1) bytes, whatever the partition count.
STAGED_BATCH_LIMIT = (48 * 1024 - 52) // 12


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [132, 22])
def test_gpu_large_batches_and_past_shared_memory(parts):
    limit = STAGED_BATCH_LIMIT
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    rng = random.Random(parts)
    for b in (65, 255, 256, 257, 1000, 4096, limit, limit + 1, 16384):
        topk_length = [rng.choice([0, 1, 2048, rng.randrange(2049)]) for _ in range(b)]
        case = dict(batch_size=b, num_sm_parts=parts, block_size_n=64, fixed_overhead_num_blocks=5)
        case |= dict(topk=2048, extra_topk=512, topk_length=topk_length)
        run_all_three(case, baseline=4 * (5 * b + 1) <= optin)


@pytest.mark.gpu
def test_gpu_closed_form_refuses_a_batch_past_its_staging():
    """The .cu launches the kernel the plan names, and refuses the closed form where its
    staging would not fit (the admission never plans that)."""
    b = STAGED_BATCH_LIMIT + 1
    meta, splits = outputs(b, 132, "cuda")
    plan = DecodingSchedPlan(SchedKernel.CLOSED_FORM, SPARSE_CONFIG)
    forced = admit(SchedKernel.CLOSED_FORM.value, "forced by the test", MODULE, plan)
    with pytest.raises(ValueError, match="in-place kernel"):
        decoding_sched_meta(meta, splits, SPARSE_CONFIG, admission=forced)


@pytest.mark.gpu
def test_gpu_many_partitions():
    # Partition counts well past the SM count (the records are derived one thread per partition).
    rng = random.Random(5)
    for parts in (255, 256, 257, 600, 2000):
        for b in (1, 7, 64):
            topk_length = [rng.randrange(2049) for _ in range(b)]
            case = dict(batch_size=b, num_sm_parts=parts, block_size_n=64, topk=2048)
            run_all_three(case | dict(fixed_overhead_num_blocks=5, topk_length=topk_length))


@pytest.mark.gpu
def test_gpu_side_stream_and_config():
    parts, overhead = device_sched_config(torch.device("cuda"), s_q=1, h_q=64)
    props = torch.cuda.get_device_properties(0)
    if props.major == 9:
        assert parts == props.multi_processor_count and overhead == 5
    topk_length = torch.randint(0, 2049, (8,), dtype=torch.int32, device="cuda")
    meta, splits = outputs(8, parts, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        decoding_sched_meta(meta, splits, SPARSE_CONFIG, topk_length=topk_length)
    stream.synchronize()
    want = reference(batch_size=8, num_sm_parts=parts, topk_length=topk_length.cpu(), **SPARSE)
    assert torch.equal(meta.cpu(), want[0]) and torch.equal(splits.cpu(), want[1])


@pytest.mark.gpu
def test_gpu_non_contiguous_lengths_take_the_fallback():
    wide = torch.randint(0, 2049, (8, 2), dtype=torch.int32, device="cuda")
    topk_length = wide[:, 0]
    meta, splits = outputs(8, 22, "cuda")
    assert not decoding_sched_meta_admission(meta, splits, SPARSE_CONFIG, topk_length=topk_length)
    decoding_sched_meta(meta, splits, SPARSE_CONFIG, topk_length=topk_length)
    want = reference(batch_size=8, num_sm_parts=22, topk_length=topk_length.cpu(), **SPARSE)
    assert torch.equal(meta.cpu(), want[0]) and torch.equal(splits.cpu(), want[1])


@pytest.mark.gpu
@pytest.mark.parametrize("b, parts", [(1, 132), (6, 22), (64, 132)])
def test_gpu_graph_replay_follows_new_lengths(b, parts):
    gen = torch.Generator().manual_seed(b)
    topk_length = torch.zeros(b, dtype=torch.int32, device="cuda")
    extra_topk_length = torch.zeros(b, dtype=torch.int32, device="cuda")
    sched = DecodingSchedMeta.empty(
        batch_size=b,
        num_sm_parts=parts,
        device="cuda",
        config=DecodingSchedConfig(topk=2048, extra_topk=512),
    )
    lengths = dict(topk_length=topk_length, extra_topk_length=extra_topk_length)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sched.schedule(**lengths)  # the warm-up run marks the schedule computed...
    torch.cuda.current_stream().wait_stream(stream)
    sched.reset()  # ...so reset it, or capture would record no scheduler launch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _layer in range(3):
            meta, splits = sched.schedule(**lengths)
    assert sched.computed
    for _ in range(5):
        new_topk = torch.randint(0, 2049, (b,), generator=gen, dtype=torch.int32)
        new_extra = torch.randint(0, 513, (b,), generator=gen, dtype=torch.int32)
        topk_length.copy_(new_topk)
        extra_topk_length.copy_(new_extra)
        sched.tile_scheduler_metadata.fill_(-7)
        sched.num_splits.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        want = reference(
            batch_size=b,
            num_sm_parts=parts,
            topk=2048,
            extra_topk=512,
            topk_length=new_topk,
            extra_topk_length=new_extra,
        )
        assert torch.equal(meta.cpu(), want[0]) and torch.equal(splits.cpu(), want[1])


@pytest.mark.gpu
def test_gpu_check_cases():
    from dsv41_kernels.check import run_case

    records = [run_case(c, timed=False) for c in check_cases(torch.device("cuda"), small=False)]
    assert records and all(r["exact"] and r["path"] == "kernel" for r in records)


def test_admission_needs_a_toolchain(monkeypatch):
    """A serving image with apache-tvm-ffi but no nvcc: the kernel is refused (the reference
    runs) as every other op's CUDA path is, instead of raising inside SGLang's scheduler hook."""
    meta, splits = (on_cuda(t) for t in outputs(4, 22))
    pretend_toolchain(False, monkeypatch.setattr)
    verdict = decoding_sched_meta_admission(meta, splits, SPARSE_CONFIG)
    assert not verdict and "toolchain" in verdict.reason
    pretend_toolchain(True, monkeypatch.setattr)
    assert decoding_sched_meta_admission(meta, splits, SPARSE_CONFIG).kernel == "cuda closed form"


def test_the_batch_size_chooses_the_kernel(monkeypatch):
    """The closed form while its staging fits the 48 KB a launch gets without an attribute
    call (the .cu refuses it past that), the walk in place beyond; the plan carries the
    config as checked (NumPy integers become ints)."""
    pretend_toolchain(True, monkeypatch.setattr)
    assert (
        staged_bytes(STAGED_BATCH_LIMIT)
        <= STAGING_LIMIT_BYTES
        < staged_bytes(STAGED_BATCH_LIMIT + 1)
    )
    config = dataclasses.replace(SPARSE_CONFIG, topk=np.int64(2048))
    for b, kernel in (
        (1, SchedKernel.CLOSED_FORM),
        (STAGED_BATCH_LIMIT, SchedKernel.CLOSED_FORM),
        (STAGED_BATCH_LIMIT + 1, SchedKernel.IN_PLACE),
        (16384, SchedKernel.IN_PLACE),
    ):
        meta, splits = (on_cuda(t) for t in outputs(b, 132))
        admission = decoding_sched_meta_admission(meta, splits, config)
        assert admission.kernel == kernel.value and admission.plan == DecodingSchedPlan(
            kernel, SPARSE_CONFIG
        )
        assert type(admission.plan.config.topk) is int


def test_numpy_integers_are_ints_and_bools_are_not():
    plain = decoding_sched_meta(*outputs(4, 22), SPARSE_CONFIG)
    numpy = DecodingSchedConfig(
        topk=np.int64(2048),
        extra_topk=np.int32(512),
        block_size_n=np.int64(64),
        fixed_overhead_num_blocks=np.uint8(5),
    )
    assert all(
        torch.equal(a, b) for a, b in zip(decoding_sched_meta(*outputs(4, 22), numpy), plain)
    )
    args = dict(num_sms=np.int64(132), s_q=np.int32(1), h_q=np.int64(64), arch_major=np.int64(9))
    assert num_sm_parts(**args) == 132 and type(num_sm_parts(**args)) is int
    for field in ("topk", "block_size_n", "fixed_overhead_num_blocks"):
        config = dataclasses.replace(SPARSE_CONFIG, **{field: True})
        with pytest.raises(ValueError, match=f"{field} must be an int, got the bool"):
            decoding_sched_meta(*outputs(4, 22), config)
        assert field in decoding_sched_meta_admission(*outputs(4, 22), config).reason
    with pytest.raises(ValueError, match="s_q must be an int"):
        num_sm_parts(num_sms=132, s_q=True, h_q=64, arch_major=9)


def test_fixed_overhead_takes_the_scalar_rule():
    assert fixed_overhead_num_blocks(arch_major=np.int64(10), h_q=np.int32(128), d_qk=512) == 3
    for bad in (dict(arch_major=10.0), dict(h_q=True), dict(d_qk="512")):
        args = dict(arch_major=10, h_q=128, d_qk=512) | bad
        with pytest.raises(ValueError, match=f"^{next(iter(bad))} must be an int"):
            fixed_overhead_num_blocks(**args)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta", "nonsense", 2.5])
def test_device_sched_config_names_its_device(device):
    with pytest.raises(ValueError, match="device"):
        device_sched_config(device, s_q=1, h_q=64)

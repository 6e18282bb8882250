"""GPU tier: our schedule inside FlashMLA's real sparse decode, called the way SGLang calls it.

SGLang 0.5.23's DeepSeek-V4 backend (``sglang.srt.layers.attention.deepseek_v4_backend``,
``DeepseekV4AttnBackend._forward_attention``) runs, for a DeepSeek-V4.1 decode or verify step on
SM90, ``_maybe_precompute_flashmla_sched_meta(metadata, q=, indices=, topk_length=,
extra_indices=, extra_topk_length=)`` (hooked by our plugin) and then
``flash_mla_interface.flash_mla_with_kvcache(..., use_legacy=not swa_interleaved)`` on the same
``FlashMLASchedMeta``. :func:`sglang_decode` below repeats exactly that pair of calls. FlashMLA's
own schedule is what the same decode writes into a fresh, empty metadata object (it runs its
scheduler inside the call when ``tile_scheduler_metadata`` is None): the reference everywhere here.
SGLang's unhooked function (``__wrapped__``) is no reference on SM90: it returns at once there.

Properties, one test each:
  * ``out`` / ``lse`` are bit-identical with our schedule and with FlashMLA's own, and FlashMLA
    consumes ours as given (same buffers, unchanged);
  * the schedule itself (the seven defined fields of every record, and ``num_splits``) equals
    FlashMLA's own;
  * inside a CUDA graph, replays with ``topk_length`` rewritten in place equal an eager run of
    FlashMLA's own schedule on the new lengths;
  * FlashMLA also accepts our schedule at the other shapes it takes (s_q 2, 128 heads).

Read in the sources (not assumptions): SM90 SGLang stores the V4 layout (``select_dsv4_kv_layout``:
"auto" off SM100 gives ``KVLayout.V4``), 584 bytes a token in block-split pages (``page_size`` rows
of 448 e4m3 + 64 bf16, then ``page_size`` rows of 7 ue8m0 exponents + 1 pad, the page padded to a
multiple of 576 bytes), a uint8 buffer viewed as the fp8 KV dtype and sliced and viewed as
``[pages, page_size, 1, 584]`` by the backend; SWA page size 256 (``kv_cache_configurator``); the
legacy SM90 kernel always splits the KV, so FlashMLA always computes or consumes a schedule there.

Assumptions the tests rest on (chosen, not read from a source):
  1. The cache contents are built here byte by byte after FlashMLA's ``tests/quant.py`` (its
     "MODEL1" layout), not by SGLang's store kernel: finite e4m3 values, bf16 RoPE values, ue8m0
     exponents 125..129 (scales 1/4..4), pad byte 0. Any bytes would do for a bitwise comparison;
     finite ones keep NaN from hiding a difference.
  2. The extra (compressed) cache uses the c4 page size, 256 / 4 = 64, also for the "512 + 128"
     case (SGLang's c128 pool has 2-token pages there). Page sizes do not enter the schedule.
  3. Index tensors hold random valid slots with about 1 in 16 set to -1 (SGLang pads with -1),
     including positions past ``topk_length``; FlashMLA masks those.
  4. On SM100 the same legacy path runs with the V4 layout (what SGLang does with
     ``SGLANG_DSV4_KV_LAYOUT=v4``; its SM100 default is V4.1 and the ``flashmla_mega`` backend,
     not exercised here). There FlashMLA splits the KV, and so has a schedule, only when
     top-k + extra top-k > 640; below that it ignores ours and computes none.
  5. The CUDA graph test needs our scheduler's kernel path (apache-tvm-ffi installed): the
     reference fallback reads the lengths on the host, which cannot be captured.
  6. Both schedulers of sgl-flash-mla 1.0.0 (the legacy one SM90 runs and the current one) write
     ``begin_block_idx = 0`` in the partitions left over after the last request (read from their
     SASS); ours does too. Only ``test_schedule_equals_flashmla_own`` checks that field;
     FlashMLA's kernels never read it.
"""

from __future__ import annotations

import pytest
import torch

from test.sglang import callers

pytestmark = pytest.mark.gpu


# (top-k, extra top-k): main cache only, and with the compressed (extra) cache
TOPKS = ((512, 0), (2048, 0), (2048, 512), (512, 128))
BATCHES = (1, 2, 5, 11, 32, 64)  # requests; FlashMLA's batch is 6 per request
LENGTHS = ("random", "zero", "one")
HOOK = "decoding_sched_meta._maybe_precompute_flashmla_sched_meta"
RECORD_FIELDS = (
    "begin_req_idx",
    "end_req_idx",
    "begin_block_idx",
    "end_block_idx",
    "begin_split_idx",
    "is_first_req_splitted",
    "is_last_req_splitted",
)  # the eighth word is padding: FlashMLA never writes it


# ---------------------------------------------------------------------------------------------
# Environment: FlashMLA through SGLang's wrapper, our hook in place


@pytest.fixture(scope="module")
def flashmla(plugin):
    """SGLang's backend module and FlashMLA wrapper, with our hook installed; skips with the
    reason where FlashMLA's sparse decode cannot run."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        pytest.skip(f"FlashMLA's sparse decode runs on SM90 and SM100 only, not SM{major}{minor}")
    try:
        import flash_mla
        from sglang.kernels.ops.attention import flash_mla_interface  # noqa: F401
    except Exception as e:  # ImportError, or the extension failing to load
        pytest.skip(f"flash_mla (sgl-flash-mla) does not import: {type(e).__name__}: {e}")
    if not flash_mla.has_legacy():
        pytest.skip("sgl-flash-mla was built without its legacy kernels (SM90, the V4 cache)")
    decoder = callers.flashmla_decoder()
    state = plugin.status().get("decoding_sched_meta")
    if state != "on":
        pytest.fail(f"our scheduler hook is not on: {state}")
    if not hasattr(decoder.backend._maybe_precompute_flashmla_sched_meta, "__wrapped__"):
        pytest.fail("deepseek_v4_backend._maybe_precompute_flashmla_sched_meta is not hooked")
    return decoder


@pytest.fixture(scope="module")
def caches(flashmla):
    return callers.v4_caches()


def flashmla_own(flashmla, step: callers.Step):
    """FlashMLA's own schedule and result: a fresh metadata object, filled inside the decode."""
    metadata = flashmla.backend._create_flashmla_metadata()
    out, lse = callers.sglang_decode(flashmla, step, metadata, ours=False)
    return metadata, out, lse


_BITS = {torch.bfloat16: torch.int16, torch.float32: torch.int32}


def assert_same_bits(name: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
    a = ours.contiguous().view(_BITS[ours.dtype])
    b = theirs.contiguous().view(_BITS[theirs.dtype])
    differ = a != b
    if differ.any():
        first = differ.nonzero()[0].tolist()
        raise AssertionError(
            f"{name}: {int(differ.sum())} of {a.numel()} values differ in their bits "
            f"(first at {first}: ours {ours[tuple(first)].item()}, FlashMLA's "
            f"{theirs[tuple(first)].item()})"
        )


def assert_same_schedule(ours, theirs) -> None:
    """Seven defined fields of every record, and num_splits, equal; mismatches listed."""
    meta, own_meta = ours.tile_scheduler_metadata.cpu(), theirs.tile_scheduler_metadata.cpu()
    assert meta.shape == own_meta.shape, (
        f"num_sm_parts: ours {meta.shape[0]}, FlashMLA's {own_meta.shape[0]}"
    )
    differ = (meta[:, :7] != own_meta[:, :7]).nonzero().tolist()
    if differ:
        shown = ", ".join(
            f"part {p} {RECORD_FIELDS[f]}: ours {int(meta[p, f])}, FlashMLA's {int(own_meta[p, f])}"
            for p, f in differ[:8]
        )
        raise AssertionError(f"{len(differ)} record fields differ: {shown}")
    assert torch.equal(ours.num_splits.cpu(), theirs.num_splits.cpu()), (
        f"num_splits: ours {ours.num_splits.tolist()}, FlashMLA's {theirs.num_splits.tolist()}"
    )


def splits_kv(flashmla, topk: int, extra_topk: int) -> bool:
    """Whether FlashMLA's legacy decode splits the KV (so has a schedule): always on SM90,
    past 640 indices on SM100."""
    return flashmla.arch == 9 or topk + extra_topk > 640


def seed(bs: int, topk: int, mode: str) -> int:
    return (bs * 4099 + topk) * 8 + LENGTHS.index(mode)


CASES = [
    pytest.param(bs, topk, extra, mode, id=f"b{callers.VERIFY_ROWS * bs}-k{topk}+{extra}-{mode}")
    for topk, extra in TOPKS
    for bs in BATCHES
    for mode in LENGTHS
]


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("bs, topk, extra_topk, mode", CASES)
def test_attention_bits_equal_with_our_schedule(
    flashmla, caches, fired, bs, topk, extra_topk, mode
):
    b, case_seed = callers.VERIFY_ROWS * bs, seed(bs, topk, mode)
    step = callers.make_step(
        caches, b=b, topk=topk, extra_topk=extra_topk, mode=mode, seed=case_seed
    )
    metadata = flashmla.backend._create_flashmla_metadata()
    callers.precompute(flashmla, step, metadata)
    assert fired()[HOOK] == {"ours": 1, "sglang": {}}
    # SGLang's own function leaves the object empty on SM90: a schedule here is ours.
    assert metadata.tile_scheduler_metadata is not None, "the hook did not fill the schedule"
    given = metadata.tile_scheduler_metadata
    given_values = given.clone()
    out, lse = callers.sglang_decode(
        flashmla, step, metadata, ours=False
    )  # the schedule is in place
    # FlashMLA consumed ours as given: returned the same buffers, wrote nothing into them.
    assert metadata.tile_scheduler_metadata.data_ptr() == given.data_ptr()
    assert torch.equal(metadata.tile_scheduler_metadata, given_values)

    _, own_out, own_lse = flashmla_own(flashmla, step)
    assert_same_bits("out", out, own_out)
    assert_same_bits("lse", lse, own_lse)


@pytest.mark.parametrize("bs, topk, extra_topk, mode", CASES)
def test_schedule_equals_flashmla_own(flashmla, caches, bs, topk, extra_topk, mode):
    b, case_seed = callers.VERIFY_ROWS * bs, seed(bs, topk, mode)
    step = callers.make_step(
        caches, b=b, topk=topk, extra_topk=extra_topk, mode=mode, seed=case_seed
    )
    ours = flashmla.backend._create_flashmla_metadata()
    callers.precompute(flashmla, step, ours)
    assert ours.tile_scheduler_metadata is not None, "the hook did not fill the schedule"
    theirs, _, _ = flashmla_own(flashmla, step)
    if not splits_kv(flashmla, topk, extra_topk):
        assert theirs.tile_scheduler_metadata is None
        pytest.skip(f"SM100 decode does not split {topk}+{extra_topk} indices: no schedule")
    assert_same_schedule(ours, theirs)


@pytest.mark.parametrize("topk, extra_topk", TOPKS, ids=[f"k{k}+{e}" for k, e in TOPKS])
@pytest.mark.parametrize("bs", (1, 11, 64))
def test_cuda_graph_replay_with_new_lengths(flashmla, caches, bs, topk, extra_topk):
    b = callers.VERIFY_ROWS * bs
    step = callers.make_step(
        caches, b=b, topk=topk, extra_topk=extra_topk, mode="random", seed=bs + topk
    )

    # Warm-up, eager, on a side stream (JIT build of our kernel, FlashMLA's kernel attributes),
    # as SGLang's graph runner warms up before capturing.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        callers.sglang_decode(
            flashmla, step, flashmla.backend._create_flashmla_metadata(), ours=True
        )
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    # A fresh object at capture (as on_after_cuda_graph_warmup does): the graph records the
    # schedule's computation, so each replay reschedules from the lengths it finds.
    metadata = flashmla.backend._create_flashmla_metadata()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = callers.sglang_decode(flashmla, step, metadata, ours=True)
    assert metadata.tile_scheduler_metadata is not None, "the hook did not fill the schedule"

    gen = torch.Generator().manual_seed(bs * 31 + topk)
    for mode in ("random", "zero", "one", "random"):
        step.swa_topk_lengths.copy_(
            callers.lengths(mode, b, topk, gen)
        )  # in place, as SGLang writes
        if extra_topk:
            step.extra_topk_lengths.copy_(callers.lengths(mode, b, extra_topk, gen))
        graph.replay()
        torch.cuda.synchronize()
        own, own_out, own_lse = flashmla_own(flashmla, step)
        assert_same_bits(f"out after {mode} lengths", out, own_out)
        assert_same_bits(f"lse after {mode} lengths", lse, own_lse)
        if splits_kv(flashmla, topk, extra_topk):
            # Rescheduled on replay (the records are test_schedule_equals_flashmla_own's part).
            assert torch.equal(metadata.num_splits.cpu(), own.num_splits.cpu()), mode


@pytest.mark.parametrize(
    "s_q, h_q", ((2, 64), (1, 128)), ids=("s_q2-h64", "s_q1-h128")
)  # FlashMLA takes these too: num_sm_parts = num_sms / s_q / (h_q / 64) on SM90
@pytest.mark.parametrize("topk, extra_topk", ((2048, 0), (512, 128)), ids=("k2048+0", "k512+128"))
def test_flashmla_takes_our_schedule_at_other_shapes(flashmla, caches, s_q, h_q, topk, extra_topk):
    for bs in (1, 11):
        b = callers.VERIFY_ROWS * bs
        step = callers.make_step(
            caches, b=b, topk=topk, extra_topk=extra_topk, mode="random", seed=bs, s_q=s_q, h_q=h_q
        )
        metadata = flashmla.backend._create_flashmla_metadata()
        out, lse = callers.sglang_decode(
            flashmla, step, metadata, ours=True
        )  # raises if FlashMLA refuses
        own, own_out, own_lse = flashmla_own(flashmla, step)
        if own.tile_scheduler_metadata is not None:
            assert metadata.tile_scheduler_metadata.shape == own.tile_scheduler_metadata.shape
        assert_same_bits(f"out b{b}", out, own_out)
        assert_same_bits(f"lse b{b}", lse, own_lse)

"""Every hooked SGLang 0.5.23 call site as a list of cases, one per row count, and the timing of
one case's two arms.

:data:`SITES` maps each call site (the op its hook runs) to its :class:`Driver`. A driver's
cases are cheap to list: a :class:`Case` builds its inputs only when :meth:`Case.build` is
called, and they live as long as the call it returns, so a caller holds one case's tensors at a
time. Each case drives the call site as its SGLang callers drive it, with SGLang's dispatch for
DeepSeek-V4.1 on the GPU at hand; the sizes are the row counts the call site sees: 6 per
request at verify for the accept, the tokens of a forward for the mHC and the router, 6 per
request for the scheduler.

Inputs whose values steer nothing (the mHC's activations, the argmax's logits) are drawn on the
device, seeded per size; the accept's (whose drafts follow the logits' argmax), the router's,
the scheduler's and the attention output's come from the CPU generator the plugin's tests use,
so those cases are bitwise the tests' inputs.

:func:`measure` times a case's arms in turn, ``sglang-0.5.23`` (SGLang's own function, our
hooks taken out) and ``ours`` (the hook, which the caller forces with
``DSV41_KERNELS_FORCE=all``), and says why an arm has no figure.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from dsv41_kernels.calibrate import OURS_ARM, SGLANG_ARM
from dsv41_kernels.calibration import callers, flashmla

ARMS = (SGLANG_ARM, OURS_ARM)
FATAL = (KeyboardInterrupt, SystemExit, GeneratorExit)
"""What an arm that cannot run never swallows: every other exception, BaseExceptions included
(the stand-ins of an SGLang environment derive from BaseException), leaves the arm without a
figure and its reason."""
VOCAB = 129280
ACCEPT_BS = (1, 2, 4, 8, 16, 32, 64)
EPILOGUE_BS = (1, 2, 4, 6, 8, 10, 16, 32, 64)
Q_SIDE_ROWS = (6, 12, 24, 48, 96, 192, 384)
ARGMAX_ROWS = (1, 6, 8, 16, 32, 64, 96, 128, 256, 384)
MHC_ROWS = (1, 2, 6, 12, 24, 31, 32, 64, 96, 128, 192, 256) + (512, 1024, 2048, 4096, 8192)
MHC_ROWS += (16384, 65536)
BOUNDARY_ROWS = (1, 2, 6, 12, 24, 31, 32, 48, 64, 96, 128)
POST_COMBINE_NORM_ROWS = BOUNDARY_ROWS + (192, 256, 384)
ROUTER_TOKENS = (1, 6, 16, 64, 256, 320, 512, 1024, 2048, 2560, 4096, 16384)
SCHED_BS = (1, 4, 16, 64)
WO_A_TP = (1, 2, 4)
WO_A_TOKENS = (6, 24, 96, 384)
ERROR_CHARS = 200

DSPARK_ACCEPT = "sglang.kernels.ops.speculative.dspark.dspark_accept"
EPILOGUE = "sglang.srt.speculative.dspark_components.dspark_verify.DsparkVerifyEpilogue"
MHC = "sglang.srt.models.deepseek_v4_mhc"
DEEPSEEK_V2 = "sglang.srt.models.deepseek_v2"
DEEPSEEK_V4 = "sglang.srt.models.deepseek_v4"
V4_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
FP8_UTILS = "sglang.srt.layers.quantization.fp8_utils"


@dataclass(frozen=True)
class Case:
    """One call site at one size. ``build()`` makes the inputs on the device and returns the
    call that drives the site; ``sglang`` names the modules (or classes) and their functions
    :func:`~.callers.sglang_arm` puts back for SGLang's arm (none: every hooked one)."""

    op: str
    shape: str
    rows: int
    sglang: tuple[tuple[str, tuple[str, ...]], ...]
    build: Callable[[], Callable[[], object]]


@dataclass(frozen=True)
class Driver:
    """A call site's cases on a device, and SGLang's function the records name for it."""

    call_site: str
    cases: Callable[[torch.device], list[Case]]


def accept_cases(device) -> list[Case]:
    """``AcceptGreedy.execute(fused_argmax=True)`` on ``bs`` requests' verify logits (vocab
    129280, a tie and ±Inf planted) and drafts that diverge at a random place."""

    def build(bs):
        dspark_accept = importlib.import_module(DSPARK_ACCEPT)
        gen = torch.Generator().manual_seed(bs)
        logits = callers.verify_logits(gen, bs, VOCAB, nan=False).to(device)
        kwargs = dict(
            candidates=callers.draft_candidates(logits, bs, gen),
            target_logits=logits,
            verify_num_draft_tokens=callers.VERIFY_ROWS,
            fused_argmax=True,
        )
        return lambda: dspark_accept.AcceptGreedy.execute(**kwargs)

    rows = callers.VERIFY_ROWS
    return [
        Case(
            "accept_greedy",
            f"bs {bs} x 6, vocab 129280",
            bs * rows,
            ((DSPARK_ACCEPT, ()),),
            _at(build, bs),
        )
        for bs in ACCEPT_BS
    ]


def epilogue_cases(device) -> list[Case]:
    """``DsparkVerifyEpilogue._accept_static_greedy`` (gated, as a V4.1 server folds the KV
    commit) on the accept's inputs at ``bs`` requests, prefix lengths up to 64K."""

    def build(bs):
        epilogue = callers.verify_epilogue(bs, device)
        epilogue.begin_static_step(bs, True)  # every request live, the commit armed
        gen = torch.Generator().manual_seed(bs)
        logits = callers.verify_logits(gen, bs, VOCAB, nan=False).to(device)
        candidates = callers.draft_candidates(logits, bs, gen)
        seq_lens = torch.randint(1, 1 << 16, (bs,), generator=gen).to(device)
        io = callers.static_verify_io(logits, candidates, seq_lens)
        verify_lens = epilogue.verify_lens_buf[:bs]
        return lambda: epilogue._accept_static_greedy(
            io, verify_lens=verify_lens, gate=epilogue.inject_gate_buf, gated=True
        )

    sglang = ((EPILOGUE, ("_accept_static_greedy",)), (DSPARK_ACCEPT, ()))
    rows = callers.VERIFY_ROWS
    return [
        Case(
            "accept_greedy_epilogue",
            f"bs {bs} x 6, vocab 129280",
            bs * rows,
            sglang,
            _at(build, bs),
        )
        for bs in EPILOGUE_BS
    ]


def q_side_cases(device) -> list[Case]:
    """``MQALayer._compute_q_a`` (``_normalize_q_lora`` of ``q_lora``'s view of the fused
    ``wqkv_a`` output) at verify rows, then the
    quantization ``wq_b``'s SM90 linear applies to a bf16 input (none to our pair): the work
    between ``wqkv_a`` and ``wq_b``'s GEMM."""
    layer = functools.cache(lambda: callers.q_side_layer(device))

    def build(rows):
        qkv_a = callers.wqkv_a_output(rows, device, seed=rows)
        v41 = layer()
        return lambda: callers.wq_b_input(v41._compute_q_a(None, qkv_a=qkv_a)[1])

    sglang = ((f"{DEEPSEEK_V4}.MQALayer", ("_normalize_q_lora",)),)
    return [
        Case("rmsnorm_quant_fp8", f"[{r}, 1280] bf16 of [{r}, 1792]", r, sglang, _at(build, r))
        for r in Q_SIDE_ROWS
    ]


def argmax_cases(device) -> list[Case]:
    """``dspark_accept._row_argmax(fused=True)`` over random ``[rows, 129280]`` fp32 logits."""

    def build(rows):
        dspark_accept = importlib.import_module(DSPARK_ACCEPT)
        gen = torch.Generator(device).manual_seed(rows)
        logits = torch.randn(rows, VOCAB, generator=gen, device=device)
        return lambda: dspark_accept._row_argmax(logits, fused=True)

    sglang = ((DSPARK_ACCEPT, ("_row_argmax",)),)
    return [Case("row_argmax", f"[{r}, 129280]", r, sglang, _at(build, r)) for r in ARGMAX_ROWS]


def mhc_cases(device, site: str) -> list[Case]:
    """``deepseek_v4_mhc.mix_stats`` (``site`` ``hc_mix_stats``) or ``combine`` (else) of a V4.1
    decoder layer's attention hyper-connection on random bf16 ``[rows, 4, 5120]`` residuals
    (and, for the combine, ``pre`` weights in [0.1, 1.1)); for ``hc_combine_norm_quant_fp8``
    the combine and then the attention's first linear's input quantization
    (:func:`_then_quantized`)."""
    layer = functools.cache(
        lambda: callers.v41_decoder_layer(torch.Generator().manual_seed(0), device)
    )

    def build(rows):
        mhc = importlib.import_module(MHC)
        hc = layer().attn_hc
        gen = torch.Generator(device).manual_seed(rows)
        x = torch.randn(rows, 4, callers.HIDDEN, generator=gen, device=device, dtype=torch.bfloat16)
        if site == "hc_mix_stats":
            return lambda: mhc.mix_stats(hc, x)
        pre = torch.rand(rows, 4, generator=gen, device=device) + 0.1
        run = lambda: mhc.combine(hc, mhc.HcState(x, pre))  # noqa: E731
        return _then_quantized(run) if quantized else run

    quantized = site == "hc_combine_norm_quant_fp8"
    sglang = ((MHC, ("_mix_stats_impl",) if site == "hc_mix_stats" else ("_combine",)),)
    return _residual_cases(site, sglang, build, MHC_ROWS, quantized=quantized)


def _boundary_at(v41, rows: int, device, *, into_attention: bool = False):
    """``(mhc, y, residual, gen, boundary, consumer)`` of one boundary of ``rows`` random rows:
    the sublayer's output, the streams it joins, their generator, and the consumer's boundary and
    hyper-connection (the FFN's, or with ``into_attention`` the attention's)."""
    mhc = importlib.import_module(MHC)
    gen = torch.Generator(device).manual_seed(rows)
    draw = lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)
    y, residual = draw(rows, callers.HIDDEN), draw(rows, 4, callers.HIDDEN)
    consumer = v41.attn_hc if into_attention else v41.ffn_hc
    norm = v41.input_layernorm if into_attention else v41.post_attention_layernorm
    boundary = mhc.make_boundary(norm, accepts_mxfp8=False, hc=consumer)
    return mhc, y, residual, gen, boundary, consumer


def _chained_boundary(v41, rows: int, device, *, into_attention: bool = False):
    """A call of one boundary as ``HcReadCall.update_and_read`` runs it: ``run_attn_post`` of
    ``v41``'s attention hyper-connection with the consumer's ``HcNextBoundary``
    (:func:`_boundary_at`), then the consumer's ``combine``, whose rows it returns. The
    statistics the post leaves are the next call's precomputed ones, as in a forward."""
    mhc, y, residual, _, boundary, consumer = _boundary_at(
        v41, rows, device, into_attention=into_attention
    )
    carried = {"stats": None}

    def run():
        with one_rank_layout():
            state = mhc.run_attn_post(
                v41.attn_hc, y, residual, stats_stream=None, next=boundary,
                world_size=1, precomputed=carried["stats"],
            )  # fmt: skip
            carried["stats"] = state.stats
            return mhc.combine(consumer, state)

    return run


def _then_quantized(run):
    """``run`` (rows into an attention), then its ``wqkv_a`` block-FP8 linear's first step on
    SM90, ``sglang_per_token_group_quant_fp8(x, 32, scale_ue8m0=True)`` through ``fp8_utils``:
    SGLang's arm launches the quantizer; ours wrote the groups in its launch, and gets them."""
    fp8_utils = importlib.import_module(FP8_UTILS)

    def quantized():
        x = run()
        return fp8_utils.sglang_per_token_group_quant_fp8(
            x.view(-1, x.shape[-1]), callers.WQ_B_GROUP, scale_ue8m0=True
        )

    return quantized


def boundary_cases(device, *, quantized: bool = False) -> list[Case]:
    """One mHC boundary as ``HcReadCall.update_and_read`` runs it: ``run_attn_post`` of a V4.1
    layer's attention hyper-connection with the consumer's ``HcNextBoundary`` (the FFN one and
    its norm), then the consumer's ``combine``, on random bf16 ``[rows, 4, 5120]`` residuals.
    SGLang's arm computes the triplet inside the post (its statistics), then the post and the
    combine; ours takes the statistics the previous call's fused boundary left as precomputed,
    as it does in a forward, and runs the boundary in one launch. ``quantized``: into the
    attention, then its first linear's input quantization (:func:`_then_quantized`).

    Under :func:`one_rank_layout` (no context parallelism): past 64 rows SGLang's post asks
    whether prefill context parallelism interleaves, which a lone process has not published."""
    layer = functools.cache(
        lambda: callers.v41_decoder_layer(torch.Generator().manual_seed(0), device)
    )

    def build(rows):
        run = _chained_boundary(layer(), rows, device, into_attention=quantized)
        return _then_quantized(run) if quantized else run

    sglang = ((MHC, ("_mix_stats_impl", "_combine", "_post_fusion")),)
    site = "hc_boundary_quant_fp8" if quantized else "hc_boundary"
    return _residual_cases(site, sglang, build, BOUNDARY_ROWS, quantized=quantized)


def post_combine_norm_cases(device, *, quantized: bool = False) -> list[Case]:
    """One mHC boundary's critical path where SGLang runs the next statistics on its stats
    stream: ``run_attn_post`` of a V4.1 layer's attention hyper-connection given the stream and
    the consumer's ``HcNextBoundary``, then the consumer's ``combine``, on random bf16
    ``[rows, 4, 5120]`` residuals. The triplet comes precomputed (what the stream delivers at
    the join), so both arms time the post and the combine: SGLang's two launches, or ours in
    one; ``quantized`` as :func:`boundary_cases`'s. Under :func:`one_rank_layout`."""
    layer = functools.cache(
        lambda: callers.v41_decoder_layer(torch.Generator().manual_seed(0), device)
    )

    def build(rows):
        v41 = layer()
        mhc, y, residual, gen, boundary, consumer = _boundary_at(
            v41, rows, device, into_attention=quantized
        )
        comb = torch.rand(rows, 4, 4, generator=gen, device=device)
        triplet = (
            torch.rand(rows, 4, generator=gen, device=device) + 0.1,
            2 * torch.rand(rows, 4, generator=gen, device=device),
            comb / comb.sum(1, keepdim=True),
        )
        stream = torch.cuda.Stream(device) if torch.device(device).type == "cuda" else object()

        def run():
            with one_rank_layout():
                state = mhc.run_attn_post(
                    v41.attn_hc, y, residual, stats_stream=stream, next=boundary,
                    world_size=1, precomputed=triplet,
                )  # fmt: skip
                return mhc.combine(consumer, state)

        return _then_quantized(run) if quantized else run

    sglang = ((MHC, ("_combine", "_post_fusion")),)
    site = "hc_post_combine_norm_quant_fp8" if quantized else "hc_post_combine_norm"
    return _residual_cases(site, sglang, build, POST_COMBINE_NORM_ROWS, quantized=quantized)


def _residual_cases(site: str, sglang, build, rows, *, quantized: bool) -> list[Case]:
    """``site``'s cases on random bf16 ``[r, 4, 5120]`` residuals for each ``r`` of ``rows``;
    ``quantized``: SGLang's arm puts its FP8 group quantizer back too."""
    sglang += ((FP8_UTILS, ("sglang_per_token_group_quant_fp8",)),) if quantized else ()
    return [Case(site, f"[{r}, 4, 5120] bf16", r, sglang, _at(build, r)) for r in rows]


def one_rank_layout():
    """SGLang's parallel layout of a single rank without context parallelism, for the call
    inside (a scoped override of its runtime context; a published layout reads the same)."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().override(attn_cp_size=1)


def router_cases(device) -> list[Case]:
    """``deepseek_v2.vision_topk`` of a V4.1 MoE layer with the vision bias on ``tokens``
    random router logits over 384 experts, every other token an image token."""
    moe = functools.cache(lambda: callers.vision_moe(torch.Generator().manual_seed(5), device))

    def build(tokens):
        deepseek_v2 = importlib.import_module(DEEPSEEK_V2)
        layer = moe()
        gen = torch.Generator().manual_seed(tokens)
        ids = torch.randint(0, 129000, (tokens,), generator=gen)
        ids[::2] = callers.IMAGE_TOKEN_ID
        logits = torch.randn(tokens, callers.EXPERTS, generator=gen).to(device)
        ids = ids.to(device)
        return lambda: deepseek_v2.vision_topk(layer, logits, ids)

    sglang = ((DEEPSEEK_V2, ("vision_topk",)),)
    return [
        Case("moe_fused_gate", f"T {t}, E 384, top-6", t, sglang, _at(build, t))
        for t in ROUTER_TOKENS
    ]


def sched_cases(device) -> list[Case]:
    """FlashMLA's sparse decode of ``b = 6 bs`` queries with its schedule filled by the
    backend's precompute (our hook; SGLang's leaves it to FlashMLA) on a fresh metadata object
    each call, SWA top-k 128 and c4 top-k 512 over random V4 caches. CUDA only."""
    shared = functools.cache(lambda: (flashmla.flashmla_decoder(), flashmla.v4_caches()))

    def build(b):
        decoder, caches = shared()
        seed = b // callers.VERIFY_ROWS
        step = flashmla.make_step(caches, b=b, topk=128, extra_topk=512, mode="random", seed=seed)

        def run():
            metadata = decoder.backend._create_flashmla_metadata()
            flashmla.sglang_decode(decoder, step, metadata, ours=True)

        return run

    sglang = ((V4_BACKEND, ("_maybe_precompute_flashmla_sched_meta",)),)
    shape = "FlashMLA decode + schedule, b {}, top-k 128+512"
    rows = [callers.VERIFY_ROWS * bs for bs in SCHED_BS]
    return [Case("decoding_sched_meta", shape.format(b), b, sglang, _at(build, b)) for b in rows]


def wo_a_cases(device) -> list[Case]:
    """The attention output of an ``MQALayer`` at attention TP 1, 2 and 4 from the inverse RoPE
    to the FP8 group quantizer's views (``o`` in the 64-head padded buffer at TP > 1)."""
    layers = {
        tp: functools.cache(lambda tp=tp: callers.v41_attention_layer(tp, device)) for tp in WO_A_TP
    }

    def build(tp, tokens):
        layer = layers[tp]()
        o, positions = callers.attention_output(layer, tokens, seed=tokens + tp)
        return lambda: callers.attention_output_to_wo_a(layer, o, positions)

    sglang = ((DEEPSEEK_V4, ("fused_rope_inplace", "sglang_per_token_group_quant_fp8")),)
    shape = "T {t}, TP {tp}: o [{t}, {heads}, 512], G {groups}"
    return [
        Case(
            "inverse_rope_quant_fp8",
            shape.format(t=tokens, tp=tp, heads=64 // tp, groups=8 // tp),
            tokens,
            sglang,
            _at(build, tp, tokens),
        )
        for tp in WO_A_TP
        for tokens in WO_A_TOKENS
    ]


def _at(build, *size):
    """``build`` bound to one size: a case's :attr:`Case.build`."""
    return functools.partial(build, *size)


SITES = {
    "accept_greedy": Driver("dspark_accept.AcceptGreedy.execute(fused_argmax=True)", accept_cases),
    "row_argmax": Driver("dspark_accept._row_argmax(fused=True)", argmax_cases),
    "accept_greedy_epilogue": Driver(
        "DsparkVerifyEpilogue._accept_static_greedy(gated=True)", epilogue_cases
    ),
    "hc_mix_stats": Driver(
        "deepseek_v4_mhc.mix_stats", functools.partial(mhc_cases, site="hc_mix_stats")
    ),
    "hc_combine_norm": Driver(
        "deepseek_v4_mhc.combine", functools.partial(mhc_cases, site="hc_combine_norm")
    ),
    "hc_combine_norm_quant_fp8": Driver(
        "deepseek_v4_mhc.combine + wqkv_a's input quantization",
        functools.partial(mhc_cases, site="hc_combine_norm_quant_fp8"),
    ),
    "hc_boundary": Driver("deepseek_v4_mhc.run_attn_post + combine", boundary_cases),
    "hc_post_combine_norm": Driver(
        "deepseek_v4_mhc.run_attn_post (stats stream) + combine", post_combine_norm_cases
    ),
    "hc_boundary_quant_fp8": Driver(
        "deepseek_v4_mhc.run_attn_post + combine + wqkv_a's input quantization",
        functools.partial(boundary_cases, quantized=True),
    ),
    "hc_post_combine_norm_quant_fp8": Driver(
        "deepseek_v4_mhc.run_attn_post (stats stream) + combine + wqkv_a's input quantization",
        functools.partial(post_combine_norm_cases, quantized=True),
    ),
    "rmsnorm_quant_fp8": Driver(
        "MQALayer._normalize_q_lora + wq_b's input quantization", q_side_cases
    ),
    "moe_fused_gate": Driver("deepseek_v2.vision_topk", router_cases),
    "decoding_sched_meta": Driver(
        "FlashMLA decode with its schedule (the backend's precompute)", sched_cases
    ),
    "inverse_rope_quant_fp8": Driver(
        "MQALayer's inverse RoPE and FP8 quantizer before wo_a", wo_a_cases
    ),
}
"""Each call site's driver, by the op its hook runs."""


def inner_calls(rows: int) -> int:
    """Calls captured in one timed graph: fewer for the big shapes (100 would take seconds)."""
    return 100 if rows <= 1024 else (20 if rows <= 8192 else 5)


def error_text(error: BaseException) -> str:
    """``error`` on one line of at most :data:`ERROR_CHARS` characters."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def time_arm(arm: str, case: Case, run, timer) -> tuple[float | None, str | None]:
    """``(timer(run, case.rows), None)`` in ``arm``, or ``(None, why)`` where the arm cannot run
    here or, in ours, a hook declined (SGLang's function took a call)."""
    from dsv41_kernels.sglang_plugin import dispatch

    dispatch.reset()
    try:
        if arm == SGLANG_ARM:
            with callers.sglang_arm(case.sglang):
                return timer(run, case.rows), None
        us = timer(run, case.rows)
    except FATAL:
        raise
    except BaseException as e:
        return None, error_text(e)
    declined = {
        hook: counts["sglang"]
        for hook, counts in dispatch.fire_counts().items()
        if counts["sglang"]
    }
    if declined:
        return None, f"ours declined: {declined}"
    return us, None


def measure(case: Case, timer, repeats: int = 1) -> Iterator[tuple[str, float | None, str | None]]:
    """``(arm, us, why)`` of each arm of :data:`ARMS` in turn, ``repeats`` times, timed by
    ``timer(run, rows)``. The inputs are built first and dropped when the last arm is timed; a
    case whose inputs cannot be built gives every arm that error."""
    try:
        run, failed = case.build(), None
    except FATAL:
        raise
    except BaseException as e:
        run, failed = None, f"inputs not built: {error_text(e)}"
    for _ in range(repeats):
        for arm in ARMS:
            us, why = (None, failed) if run is None else time_arm(arm, case, run, timer)
            yield arm, us, why
    run = None

"""SGLang 0.5.23's own callers of the hooked functions, built from SGLang's real classes.

The CPU and GPU plugin tests drive these, not the patched functions themselves, so a hook that
never fires in a server fails here. Where a real constructor needs a distributed runtime (the
decoder layer), the real class is instantiated without it and given exactly the attributes its
real methods read; every method that runs is SGLang's.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

import pytest
import torch

# DeepSeek-V4.1-Flash (anchors): DSpark block 5 gives 6 verify rows per request.
VERIFY_ROWS = 6
HIDDEN = 5120
EXPERTS = 384
TOP_K = 6
IMAGE_TOKEN_ID = 129264


def sglang_cannot_run_here(error: BaseException) -> bool:
    """Whether ``error`` says a piece of SGLang's own code cannot run here: an optional package
    absent (an ImportError, or SGLang's own error raised from one, e.g. its "tilelang is not
    installed" RuntimeError for the 2-31-row mHC Sinkhorn) or, on the GPU test machine, a
    stand-in reached (``tools/sglang_env``: e.g. ``sgl_kernel.rmsnorm`` behind SGLang's CUDA
    RMSNorm)."""
    if isinstance(error, ImportError) or isinstance(error.__cause__, ImportError):
        return True
    try:
        from _sglang_env_standin import StandInUsed
    except ImportError:
        return False
    return isinstance(error, StandInUsed)


def run_sglang(fn):
    """``(fn(), None)``, or ``(None, why)`` where SGLang's own code cannot run here (any other
    error is raised)."""
    try:
        return fn(), None
    except BaseException as e:
        if not sglang_cannot_run_here(e):
            raise
        return None, f"{type(e).__name__}: {e}"


def hooked_names(module) -> list[str]:
    """The functions of ``module`` that the plugin hooks (every site's ``HOOKS``)."""
    import importlib

    from dsv41_kernels.sglang_plugin import SITES

    names = []
    for site in SITES:
        for target, _, _ in importlib.import_module(site.module).HOOKS:
            owner, _, name = target.rpartition(".")
            if owner == module.__name__:
                names.append(name)
    return names


@contextlib.contextmanager
def sglang_functions(module, *names):
    """SGLang's own functions back in place of our hooks inside the block: what the call site
    runs with the plugin off. ``names`` default to every function of ``module`` the plugin
    hooks, so a function SGLang calls from another (``_row_argmax`` inside the accept) is
    SGLang's too."""
    with pytest.MonkeyPatch.context() as patch:
        for name in names or hooked_names(module):
            patch.setattr(module, name, getattr(module, name).__wrapped__)
        yield


# ---- accept_greedy: DSpark's in-graph verify epilogue ----------------------------------------


def verify_epilogue(max_bs: int, device, *, fused_argmax: bool = True):
    """DSpark's ``DsparkVerifyEpilogue`` for a DeepSeek-V4.1 target (``fused_argmax``, as
    ``target_uses_fused_argmax`` gives it), static verify mode, one TP rank, no KV commit."""
    from sglang.srt.speculative.dspark_components.dspark_verify import DsparkVerifyEpilogue
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    tp_sync = SpecTpSync(types.SimpleNamespace(world_size=1, rank_in_group=0))
    return DsparkVerifyEpilogue(
        max_bs=max_bs,
        verify_num_draft_tokens=VERIFY_ROWS,
        device=device,
        tp_sync=tp_sync,
        fused_argmax=fused_argmax,
    )


class StaticVerifyStep:
    """The tensors one static verify step hands the epilogue (``capture_hook`` reads them off
    the logits output and the forward batch), kept so a captured graph can be replayed with
    new values written in place."""

    def __init__(self, candidates: torch.Tensor, logits: torch.Tensor):
        bs, n = candidates.shape
        device = logits.device
        self.out = types.SimpleNamespace(
            next_token_logits=logits,
            hidden_states=torch.zeros(bs * n, 8, dtype=torch.bfloat16, device=device),
        )
        self.batch = types.SimpleNamespace(
            batch_size=bs,
            input_ids=candidates.reshape(-1),
            seq_lens=torch.arange(100, 100 + bs, dtype=torch.int64, device=device),
            req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device),
            out_cache_loc=torch.zeros(bs * n, dtype=torch.int64, device=device),
            positions=torch.zeros(bs * n, dtype=torch.int64, device=device),
        )

    def run(self, epilogue):
        """SGLang's ``_static_epilogue`` -> ``_accept_static_greedy`` -> ``_accept`` ->
        ``AcceptGreedy.execute``; returns the epilogue's accept buffers (cloned)."""
        epilogue.begin_static_step(self.batch.batch_size, armed=False)
        epilogue._static_epilogue(self.out, self.batch)
        return read_accept(epilogue, self.batch.batch_size)


def read_accept(epilogue, bs: int) -> dict[str, torch.Tensor]:
    accept = epilogue.read_accept(bs)
    fields = ("correct_len", "bonus", "cap_trim_lens", "commit_lens", "new_seq_lens", "out_tokens")
    return {name: getattr(accept, name).clone() for name in fields}


def verify_logits(gen, bs: int, vocab: int, *, nan: bool) -> torch.Tensor:
    """Verify logits with ties at the row maximum, ±Inf, and (``nan``) planted NaNs."""
    rows = bs * VERIFY_ROWS
    logits = torch.randn(rows, vocab, generator=gen)
    logits[0, 7] = logits[0, vocab - 9] = logits[0].max() + 1  # a tie: the lower index wins
    if rows > 2:
        logits[2, :] = float("-inf")
        logits[1, vocab // 3] = float("inf")
    if nan:
        for r in range(1, rows, 5):
            logits[r, (r * 7919) % vocab] = float("nan")
            logits[r, (r * 104729) % vocab] = float("nan")
    return logits


def draft_candidates(logits: torch.Tensor, bs: int, gen) -> torch.Tensor:
    """Candidates whose drafts follow torch.argmax's predictions and then diverge at a random
    place per request (some accept everything)."""
    predict = torch.argmax(logits, -1).view(bs, VERIFY_ROWS).cpu()
    candidates = torch.zeros(bs, VERIFY_ROWS, dtype=torch.int64)
    candidates[:, 1:] = predict[:, :-1]
    for b in range(bs):
        k = int(torch.randint(1, VERIFY_ROWS + 1, (1,), generator=gen))
        if k < VERIFY_ROWS:
            candidates[b, k] += 1
    return candidates.to(logits.device)


# ---- hc_combine_norm, hc_mix_stats: the mHC of a DeepSeek-V4.1 decoder layer -----------------


def v41_decoder_layer(gen, device, *, hidden: int = HIDDEN, layer_id: int = 0):
    """A ``DeepseekV4DecoderLayerBase`` holding a V4.1 layer's mHC parameters and norms.

    Its constructor needs a distributed runtime and builds attention and MoE; here the real
    class is instantiated without them, given the attributes its post-load step reads, and
    SGLang's own ``refresh_mhc_norm_weight_cache`` (hooked AFTER by the plugin) then builds
    the derived weights and the two ``HcSubLayer`` s exactly as after a checkpoint load."""
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models import deepseek_v4_mhc as mhc
    from sglang.srt.models.deepseek_v4 import DeepseekV4DecoderLayerBase

    layer = DeepseekV4DecoderLayerBase.__new__(DeepseekV4DecoderLayerBase)
    torch.nn.Module.__init__(layer)
    layer.layer_id = layer_id
    layer.config = types.SimpleNamespace(model_type="deepseek_v41")
    layer.hc_pre_from_prev_sublayer = True  # V4.1's config
    layer.hc_cfg = mhc.HcConfig(
        mult=4, sinkhorn_iters=20, eps=1e-6, rms_eps=1e-6, hidden=hidden, pre_from_prev=True,
        cp_prefill=False,
    )  # fmt: skip
    for name in ("input_layernorm", "post_attention_layernorm"):
        norm = RMSNorm(hidden, eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=gen))
        setattr(layer, name, norm.to(device=device, dtype=torch.bfloat16))
    for role in ("attn", "ffn"):
        fn = torch.randn(24, 4 * hidden, generator=gen) / (4 * hidden) ** 0.5
        scale = torch.rand(3, generator=gen) + 0.5
        base = torch.randn(24, generator=gen) * 0.1
        for name, value in (("fn", fn), ("scale", scale), ("base", base)):
            param = torch.nn.Parameter(value.to(device), requires_grad=False)
            setattr(layer, f"hc_{role}_{name}", param)
    layer.refresh_mhc_norm_weight_cache()
    return layer


def sm90_mix_stats_branch(rows: int) -> str:
    """What SGLang 0.5.23's ``_mix_stats_impl`` runs on SM90 with the bf16 parts built."""
    if rows == 1:
        return "hc_mix_stats_sinkhorn (fused)"
    if rows < 32:
        return "hc_mix_stats + hc_split_sinkhorn (tilelang)"
    if rows <= 65536:
        return "hc_mix_stats_sinkhorn_bf16x3"
    return "hc_mix_stats + hc_split_sinkhorn (tilelang)"


def sm90_combine_branch(rows: int) -> str:
    """What SGLang 0.5.23's ``_combine`` runs on SM90 without a quantized consumer."""
    if 0 < rows <= 96 or 4096 <= rows <= 65536:
        return "hc_combine_norm (fused)"
    return "mhc_combine, then RMSNorm"


def combine_norm_float64(x, pre, weight, eps):
    """The combine+norm contract's yardstick: ``x_in`` as the contract rounds it, normed in
    float64 (:func:`dsv41_kernels.reference.hc_combine_norm.hc_combine_norm`)."""
    from dsv41_kernels.reference.hc_combine_norm import hc_combine_norm

    return hc_combine_norm(x.flatten(1), pre, weight, eps, dtype=torch.float64)


def bf16_ulp_error(y, ref) -> float:
    """max |y - ref| in units of one bf16 ulp at ref's magnitude (ref in float64; an exact 0
    or a subnormal counts the ulp of the smallest normal)."""
    _, exponent = torch.frexp(ref)
    ulp = torch.ldexp(torch.ones_like(ref), torch.clamp(exponent - 1, min=-126) - 7)
    return ((y.double() - ref).abs() / ulp).max().item()


# ---- moe_fused_gate: vision routing ------------------------------------------------------------


def vision_moe(gen, device, *, num_experts: int = EXPERTS, top_k: int = TOP_K, runner=None):
    """The parts of a DeepSeek-V4.1 MoE layer ``vision_topk`` reads: SGLang's real ``MoEGate``
    with the vision correction bias, its ``TopKConfig`` and routing-input resolution (a draft
    layer: no expert-location dispatch)."""
    from sglang.srt.layers.moe.topk import TopKConfig, resolve_routing_inputs
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.models.deepseek_v2 import MoEGate

    config = types.SimpleNamespace(
        n_routed_experts=num_experts, hidden_size=64, topk_method="noaux_tc", router_fp32=True
    )
    gate = MoEGate(config, None, is_deepseek_v4=True, vl_correction_bias=True)
    with torch.no_grad():
        gate.e_score_correction_bias.copy_(0.1 * torch.randn(num_experts, generator=gen))
        gate.e_score_correction_bias_vl.copy_(0.1 * torch.randn(num_experts, generator=gen))
    gate = gate.to(device)
    topk_config = TopKConfig(
        top_k=top_k,
        renormalize=True,
        correction_bias=gate.e_score_correction_bias,
        routed_scaling_factor=1.5,
        scoring_func="sqrtsoftplus",
        sqrtsoftplus_log1p=True,
        runner_backend=None if runner is None else MoeRunnerBackend(runner),
    )
    topk = types.SimpleNamespace(
        topk_config=topk_config,
        routing_inputs=lambda: resolve_routing_inputs(layer_id=0, is_draft=True),
    )
    return types.SimpleNamespace(
        topk=topk,
        gate=gate,
        config=types.SimpleNamespace(image_token_id=IMAGE_TOKEN_ID),
        layer_id=0,
    )


def reference_route(moe, logits, input_ids):
    """``(weights, ids)`` of :func:`dsv41_kernels.reference.moe_fused_gate.vision_topk` for
    :func:`vision_moe`'s layer: the torch composition both routers are measured against."""
    from sglang.srt.layers.moe.topk import _RENORMALIZE_SUM_EPSILON

    from dsv41_kernels.reference.moe_fused_gate import vision_topk

    config = moe.topk.topk_config
    return vision_topk(
        logits,
        moe.gate.e_score_correction_bias,
        moe.gate.e_score_correction_bias_vl,
        input_ids,
        image_token_id=moe.config.image_token_id,
        top_k=config.top_k,
        renormalize=config.renormalize,
        renormalize_eps=_RENORMALIZE_SUM_EPSILON,
        routed_scaling_factor=config.routed_scaling_factor,
        scale_on_output=config.apply_routed_scaling_factor_on_output,
    )


# ---- decoding_sched_meta: FlashMLA's sparse decode, as the DeepSeek-V4 backend calls it -------

H_Q = 64  # V4.1 heads, zero-padded to FlashMLA's 64 at TP > 1
D_QK = D_V = 512  # 448 nope + 64 rope
SOFTMAX_SCALE = D_QK**-0.5  # the backend's head_dim ** -0.5
MAIN_PAGE = 256  # SWA page size
EXTRA_PAGE = 64  # c4 page size (256 / 4)
MAIN_PAGES = 32  # 8192 main slots
EXTRA_PAGES = 64  # 4096 extra slots


def flashmla_decoder():
    """SGLang's V4 backend module and its FlashMLA call (``DeepseekV4AttnBackend.__init__``:
    a partial over SGLang's wrapper, legacy unless the SWA layout is interleaved, which it
    never is off SM100). Raises whatever the import raises."""
    import functools

    from sglang.kernels.ops.attention import flash_mla_interface
    from sglang.srt.layers.attention import deepseek_v4_backend as backend

    return types.SimpleNamespace(
        backend=backend,
        interface=flash_mla_interface,
        arch=torch.cuda.get_device_capability()[0],
        decode=functools.partial(flash_mla_interface.flash_mla_with_kvcache, use_legacy=True),
    )


def v4_caches(seed: int = 2026):
    """(main, extra) random V4 caches of the sizes the tests and benchmarks use."""
    gen = torch.Generator().manual_seed(seed)
    return v4_kv_cache(MAIN_PAGES, MAIN_PAGE, gen), v4_kv_cache(EXTRA_PAGES, EXTRA_PAGE, gen)


def v4_kv_cache(num_pages: int, page_size: int, gen: torch.Generator) -> torch.Tensor:
    """A random, decodable V4 cache, as the backend hands it to FlashMLA.

    The pool's buffer is uint8 ``[pages, padded page bytes]`` seen as the fp8 KV dtype; a page
    is ``page_size`` data rows of 448 e4m3 + 64 bf16 (576 bytes), then ``page_size`` scale rows
    of 7 ue8m0 exponents and a pad byte, padded to a multiple of 576. The backend keeps the first
    ``page_size * 584`` bytes of each page and views them as ``[pages, page_size, 1, 584]``
    (strides ``(padded, 584, 584, 1)``), from which FlashMLA detects the V4 format.
    """
    data_bytes, scale_bytes = 576, 8
    bytes_per_token = data_bytes + scale_bytes
    padded = -(-page_size * bytes_per_token // 576) * 576
    buf = torch.zeros(num_pages, padded, dtype=torch.uint8)
    data = buf[:, : page_size * data_bytes].view(num_pages, page_size, data_bytes)
    nope = (torch.randn(num_pages, page_size, 448, generator=gen) * 2).to(torch.float8_e4m3fn)
    rope = torch.randn(num_pages, page_size, 64, generator=gen).to(torch.bfloat16)
    data[..., :448] = nope.view(torch.uint8)
    data[..., 448:] = rope.view(torch.uint8)
    scales = buf[:, page_size * data_bytes : page_size * bytes_per_token]
    scales = scales.view(num_pages, page_size, scale_bytes)
    scales[..., :7] = torch.randint(125, 130, (num_pages, page_size, 7), generator=gen).to(
        torch.uint8
    )
    pool_buffer = buf.cuda().view(torch.float8_e4m3fn)  # DeepSeekV4SingleKVPool.get_key_buffer
    view = pool_buffer[:, : page_size * bytes_per_token].view(
        num_pages, page_size, 1, bytes_per_token
    )
    assert view.stride() == (padded, bytes_per_token, bytes_per_token, 1)
    return view


def slot_indices(b: int, s_q: int, topk: int, slots: int, gen: torch.Generator) -> torch.Tensor:
    """int32 ``[b, s_q, topk]`` global token slots (page * page_size + offset), some -1."""
    indices = torch.randint(0, slots, (b, s_q, topk), generator=gen, dtype=torch.int32)
    indices[torch.rand(b, s_q, topk, generator=gen) < 1 / 16] = -1
    return indices.cuda()


def lengths(mode: str, b: int, topk: int, gen: torch.Generator) -> torch.Tensor:
    """int32 ``[b]`` valid indices per batch entry: random in [0, topk], all 0, or all 1."""
    if mode == "random":
        values = torch.randint(0, topk + 1, (b,), generator=gen, dtype=torch.int32)
    elif mode == "zero":
        values = torch.zeros(b, dtype=torch.int32)
    elif mode == "one":
        values = torch.ones(b, dtype=torch.int32)
    else:
        raise ValueError(mode)
    return values.cuda()


@dataclass
class Step:
    """One attention layer's FlashMLA inputs at a decode/verify step, named as the backend's."""

    q: torch.Tensor  # bf16 [b, s_q, h_q, 512]
    swa_k_cache: torch.Tensor
    swa_page_indices: torch.Tensor  # int32 [b, s_q, topk]
    swa_topk_lengths: torch.Tensor  # int32 [b]
    attn_sink: torch.Tensor  # fp32 [h_q]
    extra_k_cache: torch.Tensor | None
    extra_indices: torch.Tensor | None  # int32 [b, s_q, extra_topk]
    extra_topk_lengths: torch.Tensor | None  # int32 [b]


def make_step(caches, *, b, topk, extra_topk, mode, seed, s_q=1, h_q=H_Q) -> Step:
    gen = torch.Generator().manual_seed(seed)
    main, extra = caches
    q = torch.randn(b, s_q, h_q, D_QK, generator=gen).to(torch.bfloat16).cuda()
    step = Step(
        q=q,
        swa_k_cache=main,
        swa_page_indices=slot_indices(b, s_q, topk, MAIN_PAGES * MAIN_PAGE, gen),
        swa_topk_lengths=lengths(mode, b, topk, gen),
        attn_sink=torch.randn(h_q, generator=gen).cuda(),
        extra_k_cache=None,
        extra_indices=None,
        extra_topk_lengths=None,
    )
    if extra_topk:
        step.extra_k_cache = extra
        step.extra_indices = slot_indices(b, s_q, extra_topk, EXTRA_PAGES * EXTRA_PAGE, gen)
        step.extra_topk_lengths = lengths(mode, b, extra_topk, gen)
    return step


# ---------------------------------------------------------------------------------------------
# The backend's two calls, and comparisons


def precompute(flashmla, step: Step, metadata) -> None:
    """The backend's ``_maybe_precompute_flashmla_sched_meta`` call (our hook)."""
    flashmla.backend._maybe_precompute_flashmla_sched_meta(
        metadata,
        q=step.q,
        indices=step.swa_page_indices,
        topk_length=step.swa_topk_lengths,
        extra_indices=step.extra_indices,
        extra_topk_length=step.extra_topk_lengths,
    )


def sglang_decode(flashmla, step: Step, metadata, *, ours: bool):
    """``DeepseekV4AttnBackend._forward_attention``'s FlashMLA branch for DeepSeek-V4.1 with a
    block-split cache: the schedule hook (when ``ours``), then the sparse decode on the same
    metadata object. Returns ``(out [b, s_q, h_q, 512] bf16, lse [b, h_q, s_q] fp32)``."""
    if ours:
        precompute(flashmla, step, metadata)
    return flashmla.decode(
        q=step.q,
        k_cache=step.swa_k_cache,
        head_dim_v=D_V,
        block_table=None,
        cache_seqlens=None,
        tile_scheduler_metadata=metadata,
        softmax_scale=SOFTMAX_SCALE,
        is_fp8_kvcache=True,
        indices=step.swa_page_indices,
        topk_length=step.swa_topk_lengths,
        attn_sink=step.attn_sink,
        extra_k_cache=step.extra_k_cache,
        extra_indices_in_kvcache=step.extra_indices,
        extra_topk_length=step.extra_topk_lengths,
    )


# ---- inverse_rope_quant_fp8: the attention output on the way to the FP8 wo_a (Hopper) ---------

ROPE_HOOK = "inverse_rope_quant_fp8.fused_rope_inplace"  # the hooks' fire-count keys
QUANT_HOOK = "inverse_rope_quant_fp8.sglang_per_token_group_quant_fp8"
V41_HEADS = 64
V41_O_GROUPS = 8
V41_O_LORA_RANK = 1024
V41_ROPE = dict(dim=64, seqlen=65536, original_seq_len=0, base=10000, factor=1.0, beta_fast=32,
                beta_slow=1)  # fmt: skip
"""``precompute_freqs_cis`` arguments of a pure-SWA layer (compress ratio 0) with
``DeepSeekV4Config``'s defaults: qk_rope_head_dim 64, max_position_embeddings 65536, rope_theta
10000 (``MqaAttentionBase.__init__``, deepseek_v4.py:1171-1199)."""


def v41_attention_layer(tp: int, device, *, wo_a_fp8: bool = True):
    """An ``MQALayer`` with DeepSeek-V4.1's attention-output configuration at attention TP
    ``tp``: 64 / tp heads of 512 (64 rope) in 8 / tp output groups of o-lora rank 1024, the FP8
    ``wo_a`` flag, and the RoPE table SGLang's own ``precompute_freqs_cis`` builds. Its
    constructor needs a distributed runtime and builds every projection; here the real class is
    instantiated without it and given exactly the attributes the output path reads."""
    from sglang.kernels.ops.attention.dsv4.rope import precompute_freqs_cis
    from sglang.srt.models.deepseek_v4 import MQALayer

    layer = MQALayer.__new__(MQALayer)
    torch.nn.Module.__init__(layer)
    layer.n_local_heads = V41_HEADS // tp
    layer.n_local_groups = V41_O_GROUPS // tp
    layer.head_dim = 512
    layer.qk_rope_head_dim = V41_ROPE["dim"]
    layer.o_lora_rank = V41_O_LORA_RANK
    layer.wo_a_fp8 = wo_a_fp8
    layer.use_npu_arch35_mxfp8_wo_a = False
    layer.freqs_cis = precompute_freqs_cis(**V41_ROPE).to(device)
    return layer


def attention_output(layer, tokens: int, *, seed: int, padded: bool | None = None):
    """The attention kernel's output for ``layer`` as ``MQALayer.forward`` holds it before the
    output path (``o[:, tp_slice, :]``, deepseek_v4.py:2904): a slice of the 64-head padded
    buffer when ``padded`` (default: as ``_kernel_num_heads`` pads, at TP > 1), with random
    positions into the layer's table. Returns ``(o, positions)`` on the table's device."""
    from dsv41_kernels.cases.inverse_rope_quant_fp8 import KERNEL_HEADS
    from dsv41_kernels.cases.inverse_rope_quant_fp8 import attention_output as make

    heads = layer.n_local_heads
    padded = heads < KERNEL_HEADS if padded is None else padded
    call = make(
        tokens, heads, o_groups=layer.n_local_groups, seed=seed, freqs_cis=layer.freqs_cis,
        kernel_heads=KERNEL_HEADS if padded else None, device=layer.freqs_cis.device,
    )  # fmt: skip
    return call.o, call.positions


def attention_output_to_wo_a(layer, o: torch.Tensor, positions: torch.Tensor):
    """SGLang 0.5.23's attention output on SM90 with the FP8 ``wo_a``, from the inverse RoPE to
    the quantizer's views (deepseek_v4.py:2952-3017), through ``deepseek_v4``'s own bindings
    (the names the plugin hooks, SGLang's when ``sglang_functions`` puts them back). It runs
    where ``MQALayer.forward`` runs it, inside the plugin's forward hook for ``layer`` (the rest
    of the forward needs a KV pool, FlashMLA and a distributed runtime). Returns
    ``(o_fp8 [T, G, D], o_s [T, G, D / 128])``, the contraction's inputs; ``o`` is left rotated."""
    from sglang.srt.models import deepseek_v4 as v4

    from dsv41_kernels.sglang_plugin import inverse_rope_quant_fp8 as hooks

    def output_path(layer):
        rope = layer.qk_rope_head_dim
        v4.fused_rope_inplace(
            o[..., -rope:], None, layer.freqs_cis, positions=positions, inverse=True
        )
        grouped = o.view(o.shape[0], layer.n_local_groups, -1)
        t, g, d = grouped.shape
        o_fp8, o_s = v4.sglang_per_token_group_quant_fp8(
            grouped.reshape(t * g, d).contiguous(), group_size=128, scale_ue8m0=False
        )
        return o_fp8.view(t, g, d), o_s.view(t, g, -1)

    return hooks.forward_hook(output_path, layer)


def fp8_wo_a(layer, gen: torch.Generator, device):
    """An FP8 ``wo_a`` as the checkpoint loads it: e4m3 ``[G * R, D]`` with fp32 128x128 block
    scales ``[G * R / 128, D / 128]`` (``weight_scale_inv``)."""
    g, r = layer.n_local_groups, layer.o_lora_rank
    d = layer.n_local_heads * layer.head_dim // g
    weight = (torch.randn(g * r, d, generator=gen) * 100).to(torch.float8_e4m3fn)
    scales = torch.rand(g * r // 128, d // 128, generator=gen) * 1e-3 + 1e-4
    return weight.to(device), scales.to(device)


# ---- sharded_accept_greedy: the verify logits at TP > 1 ---------------------------------------


def tp_group(rank: int, world: int):
    """SGLang's own ``GroupCoordinator`` for a TP group of ``world`` CPU ranks (gloo device
    group), once torch.distributed is initialized; stated as this process's TP group."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.runtime_context import get_parallel

    group = GroupCoordinator(
        [list(range(world))],
        local_rank=rank,
        torch_distributed_backend="gloo",
        use_pynccl=False,
        use_mscclpp=False,
        use_custom_allreduce=False,
        use_torch_symm_mem_all_reduce=False,
        use_hpu_communicator=False,
        use_xpu_communicator=False,
        group_name="tp",
    )
    get_parallel().override_permanently(tp_group=group)
    return group


def target_logits_processor(vocab: int):
    """The target model's ``LogitsProcessor`` as SGLang 0.5.23 builds it at TP > 1 without DP
    attention or a softcap. Its constructor reads the server's configuration; here the real
    class gets the attributes its ``forward`` reads, and SGLang's real ``MultimemAllGatherer``
    without a symmetric-memory state (its torch.distributed all-gather over the TP group)."""
    from sglang.srt.distributed.device_communicators.triton_symm_mem_ag import (
        MultimemAllGatherer,
    )
    from sglang.srt.layers.logits_processor import LogitsProcessor

    processor = LogitsProcessor.__new__(LogitsProcessor)
    torch.nn.Module.__init__(processor)
    attributes = dict(
        vocab_size=vocab,
        logit_scale=None,
        use_attn_tp_group=False,
        use_tp_lm_head_all_to_all=False,
        use_fp32_lm_head=False,
        use_fp32_lm_head_output=False,
        do_tensor_parallel_all_gather=True,
        do_tensor_parallel_all_gather_dp_attn=False,
        defer_verify_gather=False,
        final_logit_softcapping=None,
        rl_on_policy_target=None,
        return_full_logits=False,
        enable_mis=False,
        keep_last_hidden_states=False,
        expected_aux_hidden_states=None,
        _aux_hidden_states_checked=False,
    )
    for name, value in attributes.items():
        setattr(processor, name, value)
    gatherer = MultimemAllGatherer.__new__(MultimemAllGatherer)
    gatherer._state, gatherer._skip_entry_sync, gatherer._max_tokens = None, True, 1024
    processor._logits_gatherer = gatherer
    return processor


class TargetModel(torch.nn.Module):
    """What DSpark's worker reads of the target model: its modules (one LogitsProcessor)."""

    def __init__(self, processor):
        super().__init__()
        self.logits_processor = processor


def dspark_worker(epilogue, processor, *, mode: str = "static"):
    """A ``DSparkWorkerV2`` after its constructor (which builds the draft model and needs a
    server): the attributes that decide the verify path, the static epilogue and the target
    model holding ``processor``."""
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    worker = DSparkWorkerV2.__new__(DSparkWorkerV2)
    worker._hosts_draft = True
    worker._verify_epilogue = epilogue
    worker._verify_planner = types.SimpleNamespace(mode_value=mode)
    worker._sampling_accept_graph = None
    model_runner = types.SimpleNamespace(model=TargetModel(processor))
    worker._target_worker = types.SimpleNamespace(model_runner=model_runner)
    return worker


def logits_forward(processor, lm_head, hidden: torch.Tensor, mode: str = "TARGET_VERIFY"):
    """The target model's logits from its last hidden states: SGLang's
    ``LogitsProcessor.forward`` in forward mode ``mode`` (hidden states captured, as DSpark's
    verify asks)."""
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    metadata = LogitsMetadata(
        forward_mode=ForwardMode[mode], capture_hidden_mode=CaptureHiddenMode.FULL
    )
    input_ids = torch.zeros(hidden.shape[0], dtype=torch.int64)
    return processor(input_ids, hidden, lm_head, metadata)


def verify_executor(forward):
    """DSpark's ``TargetVerifyExecutor`` for a V4.1 target whose worker's verify forward is
    ``forward()`` (a ``LogitsProcessorOutput``); ``_forward_prepared_verify`` is SGLang's."""
    from sglang.srt.speculative.dspark_components.dspark_verify import TargetVerifyExecutor

    executor = TargetVerifyExecutor.__new__(TargetVerifyExecutor)
    executor._target_is_dsv41 = True
    executor.verify_num_draft_tokens = VERIFY_ROWS
    executor.target_worker = types.SimpleNamespace(
        forward_batch_generation=lambda **_: types.SimpleNamespace(
            logits_output=forward(), can_run_cuda_graph=True
        )
    )
    return executor


def verify_input():
    """A prepared verify input (seq lens known on the host, so no length bound is computed)."""
    return types.SimpleNamespace(
        live_seq_lens_cpu=torch.ones(1), prepare_for_verify=lambda batch, worker: (None, None)
    )


def sampling_info(temperatures: list[float], vocab: int):
    """SGLang's ``SamplingBatchInfo`` for requests at these temperatures (0: greedy)."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    t = torch.tensor(temperatures)
    greedy = [x == 0 for x in temperatures]
    return SamplingBatchInfo(
        temperatures=t.clamp(min=1e-6)[:, None],
        top_ps=torch.ones(len(t)),
        top_ks=torch.ones(len(t), dtype=torch.int32),
        min_ps=torch.zeros(len(t)),
        is_all_greedy=all(greedy),
        is_any_greedy=any(greedy),
        need_top_p_sampling=False,
        need_top_k_sampling=False,
        need_min_p_sampling=False,
        vocab_size=vocab,
        device="cpu",
    )


def verify_batch(info=None, *, return_logprob: bool = False, has_grammar: bool = False):
    """What ``_forward_prepared_verify`` and the worker's accept read of a ``ScheduleBatch``."""
    return types.SimpleNamespace(
        sampling_info=info,
        return_logprob=return_logprob,
        has_grammar=has_grammar,
        seq_lens_cpu=None,
        seq_lens_sum=0,
        reqs=[],
    )

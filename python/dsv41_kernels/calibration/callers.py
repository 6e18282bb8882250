"""SGLang 0.5.23's own callers of the hooked functions, built from SGLang's real classes, and
the inputs they are driven with.

Where a real constructor needs a distributed runtime (the decoder layer, the attention layer),
the real class is instantiated without it and given exactly the attributes its real methods
read; every method that runs is SGLang's. The plugin's tests drive the same callers, so a hook
that never fires in a server fails there.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
import types

import torch

# DeepSeek-V4.1-Flash (anchors): DSpark block 5 gives 6 verify rows per request.
VERIFY_ROWS = 6
HIDDEN = 5120
EXPERTS = 384
TOP_K = 6
IMAGE_TOKEN_ID = 129264


def dotted_name(owner) -> str:
    """A module's or a class's dotted path."""
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


def hooked_names(owner) -> list[str]:
    """The functions of ``owner`` (a module or a class) that the plugin hooks (every site's
    ``HOOKS``)."""
    from dsv41_kernels.sglang_plugin import SITES

    names = []
    for site in SITES:
        for target, _, _ in importlib.import_module(site.module).HOOKS:
            path, _, name = target.rpartition(".")
            if path == dotted_name(owner):
                names.append(name)
    return names


@contextlib.contextmanager
def sglang_arm(owners):
    """:func:`sglang_functions` of each ``(dotted path of a module or class, names)`` of
    ``owners`` at once: a case's SGLang arm."""
    with contextlib.ExitStack() as stack:
        for path, names in owners:
            stack.enter_context(sglang_functions(pkgutil.resolve_name(path), *names))
        yield


@contextlib.contextmanager
def sglang_functions(module, *names):
    """SGLang's own functions back in place of our hooks inside the block: what the call site
    runs with the plugin off. ``names`` default to every function of ``module`` the plugin
    hooks, so a function SGLang calls from another (``_row_argmax`` inside the accept) is
    SGLang's too. The hooks are back in place when the block ends, however it ends."""
    hooks = {}
    try:
        for name in names or hooked_names(module):
            hooks[name] = getattr(module, name)
            setattr(module, name, hooks[name].__wrapped__)
        yield
    finally:
        for name, hook in reversed(hooks.items()):
            setattr(module, name, hook)


# ---- accept_greedy: DSpark's verify logits and drafts -----------------------------------------


def verify_epilogue(
    max_bs: int,
    device,
    *,
    fused_argmax: bool = True,
    world_size: int = 1,
    rank0_values=None,
    **flags,
):
    """DSpark's ``DsparkVerifyEpilogue`` for a DeepSeek-V4.1 target (``fused_argmax``, as
    ``target_uses_fused_argmax`` gives it), static verify mode, no KV commit, ``flags`` passed
    on (``fused_accept_tail``, ...), and a TP group of ``world_size`` ranks whose broadcast
    records what it is given (``epilogue.broadcasts``) and, with ``rank0_values``, writes the
    i-th of them into the i-th tensor broadcast, as rank 0's values arrive on another rank."""
    from sglang.srt.speculative.dspark_components.dspark_verify import DsparkVerifyEpilogue
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    broadcasts = []

    def broadcast(values, src=0):
        broadcasts.append(values.clone())
        if rank0_values is not None:
            values.copy_(rank0_values[len(broadcasts) - 1])
        return values

    group = types.SimpleNamespace(world_size=world_size, rank_in_group=0, broadcast=broadcast)
    epilogue = DsparkVerifyEpilogue(
        max_bs=max_bs,
        verify_num_draft_tokens=VERIFY_ROWS,
        device=device,
        tp_sync=SpecTpSync(group),
        fused_argmax=fused_argmax,
        **flags,
    )
    epilogue.broadcasts = broadcasts
    return epilogue


def static_verify_io(logits: torch.Tensor, candidates: torch.Tensor, seq_lens: torch.Tensor):
    """SGLang's ``StaticVerifyIO`` of a captured verify batch, with what its epilogue's accept
    reads (the KV-commit fields are left empty)."""
    from sglang.srt.speculative.dspark_components.dspark_verify import StaticVerifyIO

    return StaticVerifyIO(
        candidates=candidates,
        logits=logits,
        hidden=None,
        seq_lens=seq_lens,
        req_pool_indices=None,
        out_cache_loc=None,
        positions=None,
    )


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


# ---- moe_fused_gate: vision routing ------------------------------------------------------------


def cycle_boundaries(layers):
    """A forward's hyper-connections in order (each layer's ``attn_hc`` then ``ffn_hc``) and each
    one's consumer boundary as ``HcReadCall.next_boundary`` makes it (the next hyper-connection
    and its norm; None after the last)."""
    from sglang.srt.models import deepseek_v4_mhc as mhc

    sublayers = [hc for layer in layers for hc in (layer.attn_hc, layer.ffn_hc)]
    norms = [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    nexts = [
        mhc.make_boundary(norms[i + 1], accepts_mxfp8=False, hc=sublayers[i + 1])
        for i in range(len(sublayers) - 1)
    ]
    return sublayers, [*nexts, None]


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


# ---- inverse_rope_quant_fp8: the attention output on the way to the FP8 wo_a (Hopper) ---------

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


# ---- rmsnorm_quant_fp8: the attention's Q side on Hopper ---------------------------------------

Q_LORA_RANK, QKV_A_WIDTH = 1280, 1792  # DeepSeek-V4.1-Flash: q_lora inside wqkv_a's output
WQ_B_GROUP = 32  # V4.1's [32, 32] ue8m0 block-FP8 checkpoint


class BlockFp8WqB:
    """What SM90 holds for V4.1's ``wq_b`` and the hook reads: an ``Fp8LinearMethod`` for a
    ``[32, 32]`` ue8m0 checkpoint (SGLang's own dispatch partial,
    ``deepgemm_w8a8_block_fp8_linear_with_fallback(act_scale_ue8m0=True)``), its fp8 weight
    (1280 -> 8 heads of 512) and fp32 block scales. The GEMM itself is not modelled: both arms
    hand it the same operands."""

    def __init__(self, device, *, dispatch=None):
        from sglang.srt.layers.quantization import fp8_utils

        method = self.quant_method = type("Fp8LinearMethod", (), {})()
        method.w8a8_block_fp8_linear = dispatch or functools.partial(
            fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback, act_scale_ue8m0=True
        )
        method.use_marlin = method.use_mxfp8 = method.block_fp8_as_mxfp8 = False
        method.block_quant, method.weight_block_size = True, [WQ_B_GROUP, WQ_B_GROUP]
        self.weight = torch.zeros(4096, Q_LORA_RANK, dtype=torch.float8_e4m3fn, device=device)
        self.weight_scale_inv = torch.ones(4096 // 32, Q_LORA_RANK // 32, device=device)
        self.use_intel_amx_backend = False


def q_side_layer(device, wq_b=None, *, seed: int = 5):
    """An ``MQALayer`` with V4.1's ``q_norm`` (SGLang's ``RMSNorm(1280)``, bf16 weight) and
    ``wq_b`` (:class:`BlockFp8WqB` unless given); its constructor needs a distributed runtime,
    so the real class gets the attributes ``_compute_q_a`` and ``_normalize_q_lora`` read."""
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models.deepseek_v4 import MQALayer

    layer = MQALayer.__new__(MQALayer)
    torch.nn.Module.__init__(layer)
    gen = torch.Generator().manual_seed(seed)
    norm = RMSNorm(Q_LORA_RANK, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(Q_LORA_RANK, generator=gen))
    layer.q_norm = norm.to(device=device, dtype=torch.bfloat16)
    layer.q_lora_rank = Q_LORA_RANK
    layer.is_dsv41 = True
    object.__setattr__(layer, "wq_b", wq_b or BlockFp8WqB(device))
    return layer


def wqkv_a_output(rows: int, device, *, seed: int = 0) -> torch.Tensor:
    """``wqkv_a``'s bf16 ``[rows, 1792]`` output, whose first 1280 columns are the ``q_lora``
    ``MQALayer._compute_q_a`` normalizes."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, QKV_A_WIDTH, generator=gen) * 3).bfloat16().to(device)


def wq_b_input(for_wq_b):
    """What ``wq_b``'s SM90 linear hands DeepGEMM: a ``(q, scales)`` pair as it is, a bf16
    tensor quantized by SGLang's ``sglang_per_token_group_quant_fp8(x, 32, scale_ue8m0=True)``."""
    if isinstance(for_wq_b, tuple):
        return for_wq_b
    from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8

    return sglang_per_token_group_quant_fp8(for_wq_b, WQ_B_GROUP, scale_ue8m0=True)

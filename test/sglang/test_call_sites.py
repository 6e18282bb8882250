"""Each hooked SGLang call returns what SGLang's own code returns, on CPU inputs.

The hooks run our Triton kernels under the interpreter here; the original is the function
SGLang's registry wrapped (``__wrapped__``), run on the same inputs. Integers (argmax, accept
lengths, bonus tokens, router ids) are compared bit for bit; floats within the op's documented
bound. Spies on the plugin modules' bindings prove the call sites reached our ops.
"""

from __future__ import annotations

import types

import pytest
import torch

VOCAB = 4099  # >= the row-argmax kernel's 4096 minimum, and not a multiple of any block


@pytest.fixture
def spy(monkeypatch):
    """``spy(module, name)`` wraps ``module.name`` and returns its call counter."""

    def install(module, name):
        calls = []
        original = getattr(module, name)

        def counted(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
        return calls

    return install


def verify_logits(gen, rows, vocab=VOCAB):
    logits = torch.randn(rows, vocab, generator=gen)
    logits[0, 7] = logits[0, 4000] = logits[0].max() + 1  # a tie: the lower index wins
    logits[1, 11] = float("nan")  # torch.argmax returns the first NaN
    logits[1, 20] = float("nan")
    logits[2, :] = float("-inf")
    logits[3, 99] = float("inf")
    return logits


def candidates_for(logits, bs, n, gen, reject_at):
    predict = torch.argmax(logits, dim=-1).view(bs, n)
    candidates = torch.randint(0, VOCAB, (bs, n), generator=gen)
    candidates[:, 1:] = predict[:, :-1]
    for b, k in enumerate(reject_at):
        if k is not None:
            candidates[b, k] += 1
    return candidates


# ---------------------------------------------------------------------------------------------
# 1. greedy accept


@pytest.mark.parametrize("cutoff", [None, "capped"])
def test_accept_greedy_equals_sglang(plugin, spy, cutoff):
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from dsv41_kernels.sglang_plugin import accept

    calls = spy(accept, "accept_greedy")
    gen = torch.Generator().manual_seed(3)
    bs, n = 3, 6
    for reject_at in ([None, 1, 3], [2, None, 5], [1, 1, 1]):
        logits = verify_logits(gen, bs * n)
        candidates = candidates_for(logits, bs, n, gen, reject_at)
        cut = None if cutoff is None else torch.tensor([1, 3, 6], dtype=torch.int32)
        kwargs = dict(
            candidates=candidates,
            target_logits=logits,
            verify_num_draft_tokens=n,
            cutoff_verify_lens=cut,
        )
        ours = dspark_accept.AcceptGreedy.execute(**kwargs)  # the call site (CPU: .torch)
        theirs = dspark_accept.accept_greedy.__wrapped__(**kwargs)
        for o, t in zip(ours, theirs, strict=True):
            assert o.dtype == t.dtype and torch.equal(o, t)
        assert torch.equal(ours[0], torch.as_tensor(theirs[0]))
    assert len(calls) == 3


def test_row_argmax_equals_torch_argmax(plugin, spy):
    from sglang.kernels.ops.speculative.dspark import dspark_accept
    from sglang.srt.speculative.dspark_components import dspark_verify

    from dsv41_kernels.sglang_plugin import accept

    calls = spy(accept, "row_argmax")
    logits = verify_logits(torch.Generator().manual_seed(5), 6)
    for fused in (False, True):
        got = dspark_verify._row_argmax(logits, fused=fused)  # the verify epilogue's binding
        assert torch.equal(got, dspark_accept._row_argmax.__wrapped__(logits, fused=fused))
    assert len(calls) == 2


def test_accept_falls_back_to_sglang_when_not_admitted(plugin, spy):
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from dsv41_kernels.sglang_plugin import accept

    calls = spy(accept, "accept_greedy")
    logits = torch.randn(4, 1000)  # vocab below the kernel's minimum
    candidates = torch.zeros(2, 2, dtype=torch.int64)
    kwargs = dict(candidates=candidates, target_logits=logits, verify_num_draft_tokens=2)
    ours = dspark_accept.accept_greedy(**kwargs)
    theirs = dspark_accept.accept_greedy.__wrapped__(**kwargs)
    assert all(torch.equal(o, t) for o, t in zip(ours, theirs, strict=True))
    assert calls == []


# ---------------------------------------------------------------------------------------------
# 2. vision routing


def vision_moe(num_experts, top_k, runner):
    """The pieces of a DeepSeek-V4.1 MoE layer ``vision_topk`` reads, with SGLang's own
    ``TopKConfig`` and routing-input resolution (a draft layer: no expert-location dispatch)."""
    from sglang.srt.layers.moe.topk import TopKConfig, resolve_routing_inputs
    from sglang.srt.layers.moe.utils import MoeRunnerBackend

    gen = torch.Generator().manual_seed(num_experts)
    config = TopKConfig(
        top_k=top_k,
        renormalize=True,
        correction_bias=None,
        routed_scaling_factor=1.5,
        scoring_func="sqrtsoftplus",
        sqrtsoftplus_log1p=True,
        runner_backend=None if runner is None else MoeRunnerBackend(runner),
    )
    topk = types.SimpleNamespace(
        topk_config=config,
        routing_inputs=lambda: resolve_routing_inputs(layer_id=0, is_draft=True),
    )
    gate = types.SimpleNamespace(
        e_score_correction_bias=torch.randn(num_experts, generator=gen) * 0.1,
        e_score_correction_bias_vl=torch.randn(num_experts, generator=gen) * 0.1,
    )
    return types.SimpleNamespace(
        topk=topk, gate=gate, config=types.SimpleNamespace(image_token_id=129264), layer_id=0
    )


@pytest.mark.parametrize("runner", [None, "flashinfer_mxfp4"])
@pytest.mark.parametrize("padded", [False, True])
def test_vision_router_equals_sglang(plugin, spy, runner, padded):
    from sglang.srt.layers.moe.topk import StandardTopKOutputPacked
    from sglang.srt.multimodal.dsv41 import vl_routing

    from dsv41_kernels import pack_topk
    from dsv41_kernels.cases.moe_fused_gate import fp32_ulp_distance
    from dsv41_kernels.sglang_plugin import router

    calls = spy(router, "moe_fused_gate")
    moe = vision_moe(64, 6, runner)
    gen = torch.Generator().manual_seed(11)
    tokens = 9
    input_ids = torch.randint(0, 1000, (tokens,), generator=gen)
    input_ids[::3] = 129264  # image tokens take the alternate bias
    rows = torch.tensor([6]) if padded else None
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(tokens, 64, generator=gen).to(dtype)
        ours = vl_routing.vision_topk(moe, logits, input_ids, num_token_non_padded=rows)
        theirs = vl_routing.vision_topk.__wrapped__(
            moe, logits, input_ids, num_token_non_padded=rows
        )
        assert torch.equal(ours.topk_ids, theirs.topk_ids)
        assert int(fp32_ulp_distance(ours.topk_weights, theirs.topk_weights).max()) <= 2
        assert isinstance(ours, StandardTopKOutputPacked) == (runner is not None)
        if runner is not None:
            expected = pack_topk(ours.topk_ids, ours.topk_weights)
            assert torch.equal(ours.packed_topk_ids, expected)
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------------
# 3. combine + norm, 5. mixing statistics


def hc_sublayer(hidden, gen):
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models import deepseek_v4_mhc as mhc

    norm = RMSNorm(hidden, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=gen))
    norm = norm.to(torch.bfloat16)
    cfg = mhc.HcConfig(
        mult=4, sinkhorn_iters=20, eps=1e-6, rms_eps=1e-6, hidden=hidden, pre_from_prev=True,
        cp_prefill=False,
    )  # fmt: skip
    fn = torch.randn(24, 4 * hidden, generator=gen) * 0.02
    scale = torch.rand(3, generator=gen) + 0.5
    base = torch.randn(24, generator=gen) * 0.1
    return mhc.HcSubLayer(cfg, fn, scale, base, norm)


def combine_norm_float64(x, pre, weight, eps):
    """The combine+norm contract in float64: weighted sum, rounded to bf16, RMS-normalised."""
    c = (x.double() * pre.double()[:, :, None]).sum(1).bfloat16().double()
    return c * torch.rsqrt((c * c).mean(-1, keepdim=True) + eps) * weight.double()


def bf16_ulp_error(y, ref):
    """|y - ref| in units of one bf16 ulp at ref (ref in float64, nonzero)."""
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs())) - 7)
    return ((y.double() - ref).abs() / ulp).max().item()


@pytest.mark.parametrize("rows", [1, 6, 130])
def test_combine_equals_sglang(plugin, spy, rows):
    from sglang.srt.layers.quantization.mxfp8_input import Mxfp8SwizzledInput
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels import mxfp8_quantize
    from dsv41_kernels.sglang_plugin import combine

    plain, fused = spy(combine, "hc_combine_norm"), spy(combine, "hc_combine_norm_mxfp8")
    gen = torch.Generator().manual_seed(rows)
    hc = hc_sublayer(64, gen)
    for decade in (1e-3, 1.0, 1e3):
        x = (torch.randn(rows, 4, 64, generator=gen) * decade).bfloat16()
        pre = torch.rand(rows, 4, generator=gen) + 0.1
        ours = mhc._combine(hc, mhc.HcState(x, pre), None)
        theirs = mhc._combine.__wrapped__(hc, mhc.HcState(x, pre), None)
        assert ours.dtype == theirs.dtype == torch.bfloat16
        # The reduction orders differ, so the bar is the contract's float64 statement: ours
        # within one bf16 ulp of it, and no farther from it than SGLang's own path.
        ref = combine_norm_float64(x, pre, hc.norm.weight, hc.norm.variance_epsilon)
        error = bf16_ulp_error(ours, ref)
        assert error <= 1.0
        assert error <= max(1.0, bf16_ulp_error(theirs.detach(), ref))
        quantized = []
        y = mhc._combine(hc, mhc.HcState(x, pre), quantized)
        assert torch.equal(y, ours)
        if rows <= combine.MAX_QUANTIZED_ROWS:
            (pair,) = quantized
            assert isinstance(pair, Mxfp8SwizzledInput)
            data, scales = mxfp8_quantize(y)
            assert torch.equal(pair.data.view(torch.uint8), data.view(torch.uint8))
            assert torch.equal(pair.scales.view(torch.uint8), scales.view(torch.uint8))
        else:
            assert quantized == []  # the consumer quantizes for itself, as in SGLang
    quantized_calls = 3 if rows <= combine.MAX_QUANTIZED_ROWS else 0
    assert (len(plain), len(fused)) == (6 - quantized_calls, quantized_calls)


@pytest.fixture
def sglang_torch_sinkhorn(monkeypatch):
    """SGLang's split+Sinkhorn is a TileLang CUDA kernel; on CPU its own pure-torch statement
    (``sglang.test.kernels.mhc.hc_split_sinkhorn_torch``) stands in for it."""
    from sglang.kernels.ops.layernorm import mhc as kernels
    from sglang.test.kernels.mhc import hc_split_sinkhorn_torch

    monkeypatch.setattr(kernels, "hc_split_sinkhorn", hc_split_sinkhorn_torch)


@pytest.mark.parametrize("rows", [1, 6, 130])
def test_mix_stats_equal_sglang(plugin, spy, sglang_torch_sinkhorn, rows):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.sglang_plugin import mhc as hook

    calls = spy(hook, "hc_mix_stats")
    gen = torch.Generator().manual_seed(rows)
    hc = hc_sublayer(64, gen)
    x = torch.randn(rows, 4, 64, generator=gen).bfloat16()
    ours = mhc._mix_stats_impl(hc, x)
    theirs = mhc._mix_stats_impl.__wrapped__(hc, x)
    for name, o, t in zip(("pre", "post", "comb"), ours, theirs, strict=True):
        assert o.shape == t.shape and o.dtype == t.dtype == torch.float32, name
        # fp32 statistics by two reduction orders, through 20 Sinkhorn iterations
        torch.testing.assert_close(o, t, rtol=2e-5, atol=2e-6, msg=name)
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------
# 5. derived weights at load, and the weight updater's refusal


def decoder_layer(gen, hidden=64):
    """A ``DeepseekV4DecoderLayerBase`` carrying the attributes its post-load step reads.

    Its constructor needs a distributed runtime; the real class and its real
    ``refresh_mhc_norm_weight_cache`` / ``_init_hyper_connections`` run on this instance."""
    from sglang.srt.models.deepseek_v4 import DeepseekV4DecoderLayerBase

    hc = hc_sublayer(hidden, gen)
    layer = DeepseekV4DecoderLayerBase.__new__(DeepseekV4DecoderLayerBase)
    torch.nn.Module.__init__(layer)
    layer.layer_id = 0
    layer.hc_pre_from_prev_sublayer = True
    layer.hc_cfg = hc.cfg
    layer.input_layernorm = hc.norm
    layer.post_attention_layernorm = hc_sublayer(hidden, gen).norm
    for role in ("attn", "ffn"):
        setattr(layer, f"hc_{role}_fn", torch.nn.Parameter(hc.fn.clone(), requires_grad=False))
        setattr(layer, f"hc_{role}_scale", torch.nn.Parameter(hc.scale.clone()))
        setattr(layer, f"hc_{role}_base", torch.nn.Parameter(hc.base.clone()))
    layer.config = types.SimpleNamespace(model_type="deepseek_v41")
    return layer


def test_derived_weights_built_at_load_and_used(plugin, sglang_torch_sinkhorn):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels import HcDerivedWeights
    from dsv41_kernels.sglang_plugin import mhc as hook

    layer = decoder_layer(torch.Generator().manual_seed(1))
    layer.refresh_mhc_norm_weight_cache()  # SGLang's post-load step, hooked AFTER
    holders = layer._hc_derived_weights
    assert [type(h) for h in holders] == [HcDerivedWeights, HcDerivedWeights]
    assert hook.derived_weights(layer.attn_hc.fn) is holders[0]
    assert hook.derived_weights(layer.ffn_hc.fn) is holders[1]
    x = torch.randn(130, 4, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    ours = mhc._mix_stats_impl(layer.attn_hc, x)  # 130 rows: the compensated path
    theirs = mhc._mix_stats_impl.__wrapped__(layer.attn_hc, x)
    for o, t in zip(ours, theirs, strict=True):
        torch.testing.assert_close(o, t, rtol=2e-5, atol=2e-6)
    layer.refresh_mhc_norm_weight_cache()  # a rebuild releases the previous splits
    assert not any(h.active for h in holders)
    assert all(h.active for h in layer._hc_derived_weights)


def test_weight_updater_refuses_while_derived_weights_are_active(plugin):
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    layer = decoder_layer(torch.Generator().manual_seed(4))
    layer.refresh_mhc_norm_weight_cache()
    model = torch.nn.Sequential(layer)
    updater = WeightUpdater(
        tp_rank=0,
        device="cpu",
        gpu_id=0,
        model_config=None,
        custom_weight_loaders={},
        get_model=lambda: model,
        update_model_fields=None,
        recapture_cuda_graph=None,
        get_model_runner=None,
    )
    before = layer.hc_attn_fn.detach().clone()
    ok, message = updater.update_weights_from_tensor(
        named_tensors=[("0.hc_attn_fn", torch.zeros_like(before))]
    )
    assert not ok
    assert "refused" in message and "DSV41_KERNELS_DISABLE=mhc" in message
    assert torch.equal(layer.hc_attn_fn, before)
    for holder in layer._hc_derived_weights:  # released: SGLang no longer refuses for us
        holder.release()
    assert layer._derived_weight_cache_error is None


# ---------------------------------------------------------------------------------------------
# 4. scheduler metadata: CPU tensors leave the metadata to SGLang, untouched


def test_sched_meta_cpu_is_sglangs(plugin, spy):
    from sglang.srt.layers.attention import deepseek_v4_backend as backend

    from dsv41_kernels.sglang_plugin import sched

    calls = spy(sched, "decoding_sched_meta")
    metadata = types.SimpleNamespace(tile_scheduler_metadata=None, num_splits=None)
    q = torch.zeros(1, 6, 64, 512)
    backend._maybe_precompute_flashmla_sched_meta(
        metadata,
        q=q,
        indices=torch.zeros(1, 6, 512, dtype=torch.int32),
        topk_length=torch.ones(1, dtype=torch.int32),
        extra_indices=None,
        extra_topk_length=None,
    )
    assert metadata.tile_scheduler_metadata is None and calls == []
    assert not sched.sched_admission(q, None, None)

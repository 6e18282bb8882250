"""SGLang 0.5.23's own callers of the hooked functions, as the plugin's tests drive them.

The CPU and GPU plugin tests drive these, not the patched functions themselves, so a hook that
never fires in a server fails here. The callers the calibration drives too live in the package
(:mod:`dsv41_kernels.calibration.callers`, :mod:`dsv41_kernels.calibration.flashmla`) and are
named here as well; what only the tests use (the verify epilogue, the TP > 1 verify chain,
accuracy yardsticks, SM90 branch tables) is defined here. Where a real constructor needs a
distributed runtime, the real class is instantiated without it and given exactly the attributes
its real methods read; every method that runs is SGLang's.
"""

from __future__ import annotations

import contextlib
import types

import torch

from dsv41_kernels.calibration.callers import (  # noqa: F401  (the tests' names for them)
    EXPERTS,
    HIDDEN,
    IMAGE_TOKEN_ID,
    VERIFY_ROWS,
    BlockFp8WqB,
    attention_output,
    attention_output_to_wo_a,
    draft_candidates,
    q_side_layer,
    sglang_functions,
    v41_attention_layer,
    v41_decoder_layer,
    verify_epilogue,
    verify_logits,
    vision_moe,
    wq_b_input,
    wqkv_a_output,
)
from dsv41_kernels.calibration.flashmla import (  # noqa: F401
    Step,
    flashmla_decoder,
    lengths,
    make_step,
    precompute,
    sglang_decode,
    v4_caches,
)


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


# ---- accept_greedy: DSpark's in-graph verify epilogue ----------------------------------------


def epilogue_in_steps():
    """SGLang's own ``_accept_static_greedy`` in the block (call site
    ``accept_greedy_epilogue`` out): the static epilogue runs the accept and its tail as
    separate steps, the accept through ``AcceptGreedy.execute`` (call site ``accept_greedy``)."""
    from sglang.srt.speculative.dspark_components.dspark_verify import DsparkVerifyEpilogue

    return sglang_functions(DsparkVerifyEpilogue, "_accept_static_greedy")


@contextlib.contextmanager
def stock_epilogue():
    """The static epilogue as SGLang runs it without the plugin, in the block."""
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    with epilogue_in_steps(), sglang_functions(dspark_accept):
        yield


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


# ---- hc_combine_norm, hc_mix_stats: the mHC of a DeepSeek-V4.1 decoder layer -----------------


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


# ---- inverse_rope_quant_fp8: the attention output on the way to the FP8 wo_a (Hopper) ---------

ROPE_HOOK = "inverse_rope_quant_fp8.fused_rope_inplace"  # the hooks' fire-count keys
QUANT_HOOK = "inverse_rope_quant_fp8.sglang_per_token_group_quant_fp8"


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

"""FlashMLA's sparse decode as SGLang 0.5.23's DeepSeek-V4 backend calls it, with the schedule
(``_maybe_precompute_flashmla_sched_meta``) the plugin hooks: the backend module, random V4
caches and one step's inputs, and the backend's two calls. CUDA only (FlashMLA is)."""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

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
    """One layer's FlashMLA inputs for ``b`` queries of ``s_q`` tokens on CUDA, over
    ``caches`` (:func:`v4_caches`): random bf16 ``q`` and sink, ``topk`` SWA indices, and
    ``extra_topk`` (0: none) c4 indices, their valid lengths by ``mode`` (:func:`lengths`)."""
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


# ---- The backend's two calls ---------------------------------------------------------------


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

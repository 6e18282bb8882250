"""GPU tier: the hooked SGLang call sites on CUDA tensors (the H200), where SGLang imports.

Skipped with the reason when there is no CUDA device, or when SGLang does not import in the
GPU environment (the ``sglang`` fixture says why). SGLang's originals that need its compiled
kernel packages are compared only where those import.
"""

from __future__ import annotations

import types

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_accept_on_gpu_equals_sglang(plugin):
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    gen = torch.Generator().manual_seed(0)
    bs, n, vocab = 1, 6, 129280
    for case in range(50):
        logits = torch.randn(bs * n, vocab, generator=gen)
        if case % 5 == 0:
            logits[case % n, (case * 7919) % vocab] = float("nan")
        if case % 7 == 0:
            logits[:, 100] = logits.max() + 1  # ties at the row maximum
            logits[:, 200] = logits.max()
        logits = logits.cuda()
        predict = torch.argmax(logits, -1).view(bs, n)
        candidates = torch.cat([predict[:, :1], predict[:, :-1]], 1)
        candidates[:, 1 + case % (n - 1)] += case % 2
        cutoff = torch.full((bs,), 1 + case % n, dtype=torch.int32, device="cuda")
        for cut in (None, cutoff):
            kwargs = dict(
                candidates=candidates,
                target_logits=logits,
                verify_num_draft_tokens=n,
                cutoff_verify_lens=cut,
            )
            ours = dspark_accept.AcceptGreedy.execute(**kwargs)  # CUDA: accept_greedy_triton
            theirs = dspark_accept.accept_greedy.__wrapped__(**kwargs)  # torch.argmax rule
            for o, t in zip(ours, theirs, strict=True):
                assert torch.equal(o, t.to(o.dtype))


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability()[0] not in (9, 10),
    reason="FlashMLA's sparse decode runs on SM90/SM100 only",
)
def test_sched_meta_on_gpu_fills_schedule(plugin):
    from sglang.srt.layers.attention import deepseek_v4_backend as backend

    from dsv41_kernels.ops.attention.decoding_sched_meta import device_sched_config
    from dsv41_kernels.reference import decoding_sched_meta as reference

    for b, s_q, topk in ((1, 6, 512), (8, 1, 2048), (64, 1, 512)):
        q = torch.zeros(b, s_q, 64, 512, device="cuda", dtype=torch.bfloat16)
        lengths = torch.randint(0, topk + 1, (b,), dtype=torch.int32, device="cuda")
        metadata = types.SimpleNamespace(tile_scheduler_metadata=None, num_splits=None)
        backend._maybe_precompute_flashmla_sched_meta(
            metadata,
            q=q,
            indices=torch.zeros(b, s_q, topk, dtype=torch.int32, device="cuda"),
            topk_length=lengths,
            extra_indices=None,
            extra_topk_length=None,
        )
        parts, overhead = device_sched_config(q.device, s_q=s_q, h_q=64)
        meta, splits = reference(
            batch_size=b,
            num_sm_parts=parts,
            fixed_overhead_num_blocks=overhead,
            topk=topk,
            topk_length=lengths.cpu(),
        )
        assert torch.equal(metadata.tile_scheduler_metadata.cpu()[:, :7], meta[:, :7])
        assert torch.equal(metadata.num_splits.cpu(), splits)
        filled = metadata.tile_scheduler_metadata
        backend._maybe_precompute_flashmla_sched_meta(
            metadata,
            q=q,
            indices=torch.zeros(b, s_q, topk, dtype=torch.int32, device="cuda"),
            topk_length=lengths,
            extra_indices=None,
            extra_topk_length=None,
        )
        assert metadata.tile_scheduler_metadata is filled  # filled once, as upstream


def test_combine_and_mix_stats_on_gpu(plugin):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels import hc_combine_norm, hc_mix_stats
    from test.sglang.test_call_sites import hc_sublayer

    gen = torch.Generator().manual_seed(1)
    hc = hc_sublayer(5120, gen)
    hc = hc._replace(
        fn=hc.fn.cuda(), scale=hc.scale.cuda(), base=hc.base.cuda(), norm=hc.norm.cuda()
    )
    for rows in (1, 6, 64, 128, 300):
        x = torch.randn(rows, 4, 5120, generator=gen).bfloat16().cuda()
        pre = (torch.rand(rows, 4, generator=gen) + 0.1).cuda()
        quantized = []
        y = mhc._combine(hc, mhc.HcState(x, pre), quantized)
        expected = hc_combine_norm(x.flatten(1), pre, hc.norm.weight, hc.norm.variance_epsilon)
        assert torch.equal(y, expected)
        assert len(quantized) == (1 if rows <= 128 else 0)
        stats = mhc._mix_stats_impl(hc, x)
        direct = hc_mix_stats(
            x, hc.fn, hc.scale, hc.base, iters=20, rms_eps=1e-6, eps=1e-6, post_mult=2.0
        )
        for o, d in zip(stats, direct, strict=True):
            assert torch.equal(o, d)

"""Call site ``decoding_sched_meta``: FlashMLA's decode scheduler metadata -> our scheduler.

``sglang.srt.layers.attention.deepseek_v4_backend._maybe_precompute_flashmla_sched_meta``
fills a ``FlashMLASchedMeta``'s ``tile_scheduler_metadata [num_sm_parts, 8]`` and
``num_splits [b + 1]`` while they are still empty, so FlashMLA's sparse decode skips its own
one-thread scheduler kernel. SGLang 0.5.23 does so only on Blackwell with 64 local heads; ours
covers Hopper (SM90) and Blackwell (SM100 family) at 64 and 128 heads, with FlashMLA's
``num_sm_parts`` and fixed overhead for each (:func:`dsv41_kernels.ops.attention.
decoding_sched_meta.device_sched_config`), and any batch size (no shared-memory bound).

The buffers are allocated here only while the metadata object is empty, exactly as upstream:
the backend's ``on_after_cuda_graph_warmup()`` (not hooked) replaces the metadata objects after
warm-up, so the captured graph records this computation and reschedules every replay from
that step's ``topk_length``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.devices import sm_major
from dsv41_kernels.ops.attention.decoding_sched_meta import (
    DecodingSchedConfig,
    decoding_sched_meta,
    decoding_sched_meta_admission,
    device_sched_config,
)
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
SUPPORTED_ARCH_MAJORS = (9, 10)  # Hopper, and the SM100 family (B200/B300, GB200/GB300)
SUPPORTED_HEADS = (64, 128)


@functools.cache
def _sched_config(device_index: int, s_q: int, h_q: int, d_qk: int) -> tuple[int, int]:
    return device_sched_config(torch.device("cuda", device_index), s_q=s_q, h_q=h_q, d_qk=d_qk)


def sched_meta_admission(q: torch.Tensor, topk_length, extra_topk_length) -> Admission:
    """Ours for this decode step's shape, or SGLang's (pure: device, shapes, dtypes)."""
    if not q.is_cuda or torch.version.hip is not None:
        return refuse("not a CUDA device")
    if q.dim() != 4:
        return refuse(f"q is {q.dim()}-D, expected [b, s_q, h_q, d_qk]")
    major = sm_major(q.device.index)
    if major not in SUPPORTED_ARCH_MAJORS:
        return refuse(f"SM{major}x: FlashMLA's sparse decode scheduler is SM90/SM100")
    if q.shape[2] not in SUPPORTED_HEADS or q.shape[3] not in (512, 576):
        return refuse(f"{q.shape[2]} heads x d_qk {q.shape[3]} not a FlashMLA sparse decode shape")
    for name, t in (("topk_length", topk_length), ("extra_topk_length", extra_topk_length)):
        if t is not None and (t.dtype != torch.int32 or tuple(t.shape) != (q.shape[0],)):
            return refuse(f"{name} is not int32 [b]")
    slower = policy_refusal("decoding_sched_meta", q)
    if slower is not None:
        return slower
    return admit(f"SM{major}x, {q.shape[2]} heads")


def sched_meta_hook(
    original,
    flashmla_metadata,
    *,
    q,
    indices,
    topk_length,
    extra_indices,
    extra_topk_length,
):
    arguments = dict(
        q=q,
        indices=indices,
        topk_length=topk_length,
        extra_indices=extra_indices,
        extra_topk_length=extra_topk_length,
    )
    if getattr(flashmla_metadata, "tile_scheduler_metadata", None) is not None or (
        flashmla_metadata is None
    ):
        admission, step = refuse("no metadata object, or it already holds a schedule"), None
    else:
        admission, step = _step(q, indices, topk_length, extra_topk_length, extra_indices)
    return dispatch.run(
        "decoding_sched_meta._maybe_precompute_flashmla_sched_meta",
        admission,
        lambda: step.schedule(flashmla_metadata, admission),
        lambda: original(flashmla_metadata, **arguments),
    )


@dataclass(frozen=True)
class SchedStep:
    """This decode step's buffers FlashMLA reads, and our scheduler's arguments."""

    meta: torch.Tensor  # int32 [num_sm_parts, 8]
    num_splits: torch.Tensor  # int32 [b + 1]
    config: DecodingSchedConfig
    topk_length: torch.Tensor | None
    extra_topk_length: torch.Tensor | None

    def admission(self) -> Admission:
        return decoding_sched_meta_admission(
            self.meta,
            self.num_splits,
            self.config,
            topk_length=self.topk_length,
            extra_topk_length=self.extra_topk_length,
        )

    def schedule(self, flashmla_metadata, admission: Admission) -> None:
        """Our schedule into the buffers, then the buffers into SGLang's metadata object."""
        decoding_sched_meta(
            self.meta,
            self.num_splits,
            self.config,
            topk_length=self.topk_length,
            extra_topk_length=self.extra_topk_length,
            admission=admission,
        )
        flashmla_metadata.tile_scheduler_metadata = self.meta
        flashmla_metadata.num_splits = self.num_splits


def _step(q, indices, topk_length, extra_topk_length, extra_indices):
    """(admission, the step's :class:`SchedStep`, None when refused)."""
    admission = sched_meta_admission(q, topk_length, extra_topk_length)
    if not admission:
        return admission, None
    b, s_q, h_q, d_qk = q.shape
    parts, overhead = _sched_config(q.device.index, s_q, h_q, d_qk)
    config = DecodingSchedConfig(
        topk=indices.shape[-1],
        extra_topk=0 if extra_indices is None else extra_indices.shape[-1],
        fixed_overhead_num_blocks=overhead,
    )
    step = SchedStep(
        meta=torch.empty((parts, 8), dtype=torch.int32, device=q.device),
        num_splits=torch.empty((b + 1,), dtype=torch.int32, device=q.device),
        config=config,
        topk_length=topk_length,
        extra_topk_length=extra_topk_length,
    )
    return step.admission(), step


HOOKS = ((f"{_BACKEND}._maybe_precompute_flashmla_sched_meta", sched_meta_hook, HookType.AROUND),)
REQUIRES = (f"{_BACKEND}.DeepseekV4AttnBackend.on_after_cuda_graph_warmup",)

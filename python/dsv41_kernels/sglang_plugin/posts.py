"""Each sublayer's post, as the mHC hooks see it: AROUND hooks listed by every call site that
needs them (each registered once) call SGLang's function and, before it,
- drop the FP8 groups pinned to the sublayer's input rows (:func:`.group_quant.unpin`): the
  sublayer has returned, and it may have rewritten its input rows with a kernel, which no
  version counter sees (SGLang's in-place Triton MoE writes its output into its input). The
  posts of a forward (``deepseek_v4_mhc.run_attn_post``, ``run_moe_post``) and the plain
  ``post`` the draft stages call (``layer.hc_post``) all drop them;
- tell the post a forward runs whether SGLang gave it the stats stream
  (:func:`stats_beside_sublayer`), which decides the boundary's form (:mod:`.hc_boundary`).
"""

from __future__ import annotations

import contextvars

from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.sglang_plugin import group_quant

# Whether the post now running was given SGLang's stats stream (set around run_*_post).
_stats_beside_sublayer = contextvars.ContextVar("dsv41_stats_beside_sublayer", default=False)


def stats_beside_sublayer() -> bool:
    """Whether the post now running computes its statistics on SGLang's stats stream."""
    return _stats_beside_sublayer.get()


def post_hook(original, *args, **kwargs):
    """AROUND ``run_attn_post`` / ``run_moe_post``: SGLang's function, after the pinned groups
    are dropped, with the post told whether a ``stats_stream`` was given."""
    group_quant.unpin()
    token = _stats_beside_sublayer.set(kwargs.get("stats_stream") is not None)
    try:
        return original(*args, **kwargs)
    finally:
        _stats_beside_sublayer.reset(token)


def plain_post_hook(original, *args, **kwargs):
    """AROUND ``deepseek_v4_mhc.post``: SGLang's function, after the pinned groups are
    dropped."""
    group_quant.unpin()
    return original(*args, **kwargs)


HOOKS = (
    ("sglang.srt.models.deepseek_v4_mhc.run_attn_post", post_hook, HookType.AROUND),
    ("sglang.srt.models.deepseek_v4_mhc.run_moe_post", post_hook, HookType.AROUND),
    ("sglang.srt.models.deepseek_v4_mhc.post", plain_post_hook, HookType.AROUND),
)

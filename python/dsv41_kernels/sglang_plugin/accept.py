"""Call site 1: DSpark's greedy accept -> ``row_argmax`` / ``accept_greedy``.

SGLang 0.5.23 computes the verify argmax with ``torch.argmax`` (its fast kernel is off by
default because it selects NaN differently). Ours is bitwise ``torch.argmax``, so it is on by
default. Hooked, in ``sglang.kernels.ops.speculative.dspark.dspark_accept``:

- ``_row_argmax(logits, fused=False)``: every argmax of the verify path, including the one the
  in-graph verify epilogue takes through ``dspark_verify``'s own ``from ... import _row_argmax``
  binding (SGLang's hook registry rewrites such stale bindings when it applies a hook);
- ``accept_greedy_triton`` (``AcceptGreedy.execute`` on CUDA, eager accept and the in-graph
  epilogue) and its torch twin ``accept_greedy``: argmax and accept rule in one launch.

Both return exactly what SGLang returns (int64 argmax; int32 lengths, int64 bonus); arguments
our admission refuses go to SGLang's original function.
"""

from __future__ import annotations

import torch
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy, accept_greedy_admission
from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission

_MODULE = "sglang.kernels.ops.speculative.dspark.dspark_accept"
_ACCEPT_KEYWORDS = frozenset(
    {
        "candidates",
        "target_logits",
        "verify_num_draft_tokens",
        "cutoff_verify_lens",
        "fused_argmax",
    }
)
_INDEX_DTYPES = (torch.int32, torch.int64)


def row_argmax_hook(original, logits, fused=False):
    """``_row_argmax``: our exact argmax wherever it is admitted (``fused`` only chose
    SGLang's inexact kernel, which ours supersedes)."""
    admission = row_argmax_admission(logits)
    if admission:
        return row_argmax(logits, admission=admission)
    return original(logits, fused=fused)


def accept_admission(
    candidates, target_logits, verify_num_draft_tokens, cutoff_verify_lens
) -> Admission:
    """Our one-launch accept, for arguments SGLang's accept would take without raising."""
    if candidates.dim() != 2 or target_logits.dim() != 2:
        return refuse("candidates or logits not 2-D")
    bs, n = candidates.shape
    if n != verify_num_draft_tokens or target_logits.shape[0] != bs * n or bs == 0:
        return refuse("logits rows != bs * verify_num_draft_tokens")
    if candidates.dtype not in _INDEX_DTYPES:
        return refuse(f"candidates dtype {candidates.dtype}")
    if cutoff_verify_lens is not None and (
        cutoff_verify_lens.dtype not in _INDEX_DTYPES or tuple(cutoff_verify_lens.shape) != (bs,)
    ):
        return refuse("cutoff_verify_lens not int [bs]")
    return accept_greedy_admission(candidates, target_logits, cutoff_verify_lens)


def accept_greedy_hook(original, *args, **kwargs):
    """``accept_greedy`` / ``accept_greedy_triton`` (keyword-only in SGLang 0.5.23)."""
    if args or not kwargs.keys() <= _ACCEPT_KEYWORDS:
        return original(*args, **kwargs)
    candidates = kwargs["candidates"]
    logits = kwargs["target_logits"]
    cutoff = kwargs.get("cutoff_verify_lens")
    admission = accept_admission(candidates, logits, kwargs["verify_num_draft_tokens"], cutoff)
    if not admission:
        return original(**kwargs)
    return accept_greedy(candidates, logits, cutoff_verify_lens=cutoff, admission=admission)


HOOKS = (
    (f"{_MODULE}._row_argmax", row_argmax_hook, HookType.AROUND),
    (f"{_MODULE}.accept_greedy_triton", accept_greedy_hook, HookType.AROUND),
    (f"{_MODULE}.accept_greedy", accept_greedy_hook, HookType.AROUND),
)
REQUIRES = (
    f"{_MODULE}.AcceptGreedy",
    "sglang.srt.speculative.dspark_components.dspark_verify._row_argmax",
)

"""Call site ``accept_greedy``: DSpark's greedy accept -> ``row_argmax`` / ``accept_greedy``.

For a DeepSeek-V4.1 target SGLang 0.5.23 already runs its own split-vocab argmax
(``_FUSED_ARGMAX_TARGETS`` in ``dspark_verify`` holds ``deepseek_v41``), which differs from
``torch.argmax`` when a row holds NaN; other targets keep ``torch.argmax``. Ours is bitwise
``torch.argmax`` (NaN included) and faster than both, with the accept rule in the same launch.
In a server the verify path is DSpark's in-graph epilogue: ``DsparkVerifyEpilogue.
_static_epilogue`` -> ``_accept_static_greedy`` -> ``_accept`` -> ``AcceptGreedy.execute`` ->
``accept_greedy_triton`` on CUDA (the eager ``accept_draft_tokens`` reaches the same), wherever
call site ``accept_greedy_epilogue`` leaves the epilogue to SGLang's steps. Hooked,
in ``sglang.kernels.ops.speculative.dspark.dspark_accept``:

- ``accept_greedy_triton`` and its torch twin ``accept_greedy`` (which ``AcceptGreedy`` picks
  for CPU tensors only): argmax and accept rule in one launch;
- ``_row_argmax(logits, fused=False)``: reached on its own only by the fused accept tail
  (``SGLANG_DSPARK_FUSED_ACCEPT_TAIL=1``, off by default), also through ``dspark_verify``'s
  ``from ... import _row_argmax`` binding (SGLang's hook registry rewrites such bindings).

Both return exactly what SGLang's rule returns over ``torch.argmax`` (int64 argmax; int32
lengths, int64 bonus); arguments our admission refuses go to SGLang's original function. An
accept handed to SGLang (declined, or after an error of ours) runs as it does without the
plugin: the ``_row_argmax`` it calls is SGLang's own, counted under
``accept_greedy._row_argmax`` with :data:`SGLANGS_ACCEPT`'s reason. At
TP > 1 with call site ``sharded_accept_greedy`` armed, the accept may be handed this rank's
vocab shard of the verify logits instead: it goes to :func:`.deferred_verify.accept_on_shard`.
"""

from __future__ import annotations

import contextvars

import torch
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy, accept_greedy_admission
from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission
from dsv41_kernels.sglang_plugin import deferred_verify, dispatch
from dsv41_kernels.sglang_plugin.policy import policy_refusal

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


_in_sglangs_accept: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dsv41_kernels_in_sglangs_accept", default=False
)
"""Set while SGLang's own accept runs in place of ours (a context variable: per thread and
per task, so no other caller's argmax is affected)."""
SGLANGS_ACCEPT = refuse("inside SGLang's accept, run in place of ours")


def sglangs_accept(original):
    """SGLang's accept as it runs without the plugin: the ``_row_argmax`` it calls by its module
    name (hooked too) runs SGLang's own function for that call."""

    def call(*args, **kwargs):
        token = _in_sglangs_accept.set(True)
        try:
            return original(*args, **kwargs)
        finally:
            _in_sglangs_accept.reset(token)

    return call


def row_argmax_hook(original, logits, fused=False):
    """``_row_argmax``: our exact argmax wherever it is admitted (``fused`` only chose
    SGLang's inexact kernel, which ours supersedes), except inside SGLang's own accept."""
    if _in_sglangs_accept.get():
        admission = SGLANGS_ACCEPT
    else:  # a refusal is falsy: test for None, never for truth
        admission = policy_refusal("row_argmax", logits)
        if admission is None:
            admission = row_argmax_admission(logits)
    return dispatch.run(
        "accept_greedy._row_argmax",
        admission,
        lambda: row_argmax(logits, admission=admission),
        lambda: original(logits, fused=fused),
    )


def sglang_arguments_refusal(
    candidates, target_logits, verify_num_draft_tokens, cutoff_verify_lens
) -> Admission | None:
    """The refusal for arguments SGLang's accept would not take without raising, else None."""
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
    return None


def accept_admission(
    candidates, target_logits, verify_num_draft_tokens, cutoff_verify_lens
) -> Admission:
    """Our one-launch accept, for arguments SGLang's accept would take without raising."""
    refusal = sglang_arguments_refusal(
        candidates, target_logits, verify_num_draft_tokens, cutoff_verify_lens
    )
    if refusal is not None:
        return refusal
    slower = policy_refusal("accept_greedy", target_logits)
    if slower is not None:
        return slower
    return accept_greedy_admission(candidates, target_logits, cutoff_verify_lens)


def _accept_hook(name: str):
    """The hook for ``accept_greedy`` / ``accept_greedy_triton`` (keyword-only in 0.5.23)."""

    def hook(original, *args, **kwargs):
        original = sglangs_accept(original)
        if args or not kwargs.keys() <= _ACCEPT_KEYWORDS:
            admission = refuse("positional or unknown arguments")
        else:
            arguments = [
                kwargs["candidates"],
                kwargs["target_logits"],
                kwargs["verify_num_draft_tokens"],
                kwargs.get("cutoff_verify_lens"),
            ]
            deferred = deferred_verify.deferred_shard(kwargs["target_logits"])
            if deferred is not None:  # a verify shard (call site sharded_accept_greedy)
                refusal = sglang_arguments_refusal(*arguments)
                return deferred_verify.accept_on_shard(deferred, original, kwargs, refusal)
            admission = accept_admission(*arguments)
        return dispatch.run(
            name,
            admission,
            lambda: accept_greedy(
                kwargs["candidates"],
                kwargs["target_logits"],
                cutoff_verify_lens=kwargs.get("cutoff_verify_lens"),
                admission=admission,
            ),
            lambda: original(*args, **kwargs),
        )

    return hook


HOOKS = (
    (f"{_MODULE}._row_argmax", row_argmax_hook, HookType.AROUND),
    (
        f"{_MODULE}.accept_greedy_triton",
        _accept_hook("accept_greedy.accept_greedy_triton"),
        HookType.AROUND,
    ),
    (f"{_MODULE}.accept_greedy", _accept_hook("accept_greedy.accept_greedy"), HookType.AROUND),
)
REQUIRES = (
    f"{_MODULE}.AcceptGreedy",
    "sglang.srt.speculative.dspark_components.dspark_verify._row_argmax",
)

"""One decision per hooked call: ours or SGLang's, counted, and safe when ours fails.

Every hook ends in :func:`run`: it takes our op when the admission admits and the hook has not
failed earlier in this process, and SGLang's original function otherwise. Each call is
counted in Python, at call time, under the hook's name: ``ours``, or the reason SGLang's
function ran. Under CUDA graphs that counts captures and eager calls, never replays (a replay
runs no Python). Counting is a dict update under a lock: no host sync, no allocation on a
device, nothing that breaks capture.

When our op raises in eager mode, that call goes to SGLang's function, the hook logs the error
once at WARNING and stays off for the rest of the process (the counts and the exit report show
it). SGLang's warm-up runs before graph capture are eager, so a failure shows up there; inside
a capture the error is raised, since a half-recorded graph cannot be taken back. Switching off
reaches Python calls only: a CUDA graph captured before the error keeps replaying our kernel,
so from then on the process runs ours where those graphs replay and SGLang's function in
eager calls and in graphs captured later. Each result stays within the op's contract, but the
two differ in the bits where SGLang's function differs from ours (the op's docs say where).
When a capture had taken ours, the failure (WARNING, :func:`failed_hooks`, the counts) says
:data:`GRAPHS_KEEP_OURS`; ``DSV41_KERNELS_DISABLE`` at start-up gives one choice a process.

A hook whose result feeds state every rank holds a copy of (``replicated``: the mHC combine and
statistics feed the residual streams; every rank routes the same tokens for the MoE, whose
expert outputs are summed across ranks) raises instead of falling back when this process is
one of several ranks: SGLang's function would give this rank other bits than the ranks where
ours runs, and their copies would drift apart silently. The error then stops the server at
warm-up, on the rank that cannot run our op (``DSV41_KERNELS_DISABLE`` on every rank switches
the hook off).

``DSV41_KERNELS_REPORT=1`` prints the counts to stderr when the process exits.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from dsv41_kernels.admission import Admission

logger = logging.getLogger("dsv41_kernels.sglang_plugin")

REPORT_ENV = "DSV41_KERNELS_REPORT"
OURS = "ours"

GRAPHS_KEEP_OURS = "CUDA graphs captured before keep replaying ours"
"""Added to a hook's failure when a graph capture took our op before the error."""

_lock = threading.Lock()
_counts: dict[str, Counter] = {}
_failed: dict[str, str] = {}
_captured: set[str] = set()  # hooks whose op a CUDA-graph capture took


def _count(hook: str, outcome: str) -> None:
    with _lock:
        _counts.setdefault(hook, Counter())[outcome] += 1


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def ranks() -> int:
    """Processes in this one's default ``torch.distributed`` group (1 without one)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def run(
    hook: str,
    admission: Admission,
    ours: Callable[[], Any],
    original: Callable[[], Any],
    *,
    replicated: bool = False,
):
    """``ours()`` when ``admission`` admits and ``hook`` has not failed before, else
    ``original()``; the call is counted under ``hook``. ``replicated``: the result feeds
    state every rank holds a copy of, so an error of ours is raised on a multi-rank run."""
    failure = _failed.get(hook)
    if failure is not None:
        _count(hook, f"off after an error: {failure}")
        return original()
    if not admission:
        _count(hook, admission.reason)
        return original()
    try:
        result = ours()
    except Exception as e:
        if _capturing():
            raise
        failure = f"{type(e).__name__}: {e}"[:200]
        if replicated and ranks() > 1:
            _count(hook, f"raised on 1 of {ranks()} ranks: {failure}")
            logger.error(
                "dsv41-kernels: %s raised on this rank of %d; not falling back to SGLang's "
                "function, whose bits would differ from the other ranks' replicated state",
                hook,
                ranks(),
            )
            raise
        with _lock:
            graphs_keep_ours = hook in _captured
            if graphs_keep_ours:
                failure = f"{failure}; {GRAPHS_KEEP_OURS}"
            first = hook not in _failed
            _failed[hook] = failure
        if first:
            logger.warning(
                "dsv41-kernels: %s raised, SGLang's function runs instead from now on in this "
                "process%s",
                hook,
                f" ({GRAPHS_KEEP_OURS})" if graphs_keep_ours else "",
                exc_info=True,
            )
        _count(hook, f"error: {failure}")
        return original()
    if hook not in _captured and _capturing():
        with _lock:
            _captured.add(hook)
    _count(hook, OURS)
    return result


def fire_counts() -> dict[str, dict[str, Any]]:
    """Per hook: ``{"ours": calls our op took, "sglang": {reason: calls}}`` (eager calls and
    captures; replays of a captured graph run no Python and are not counted)."""
    with _lock:
        snapshot = {hook: dict(counter) for hook, counter in _counts.items()}
    return {
        hook: {
            "ours": outcomes.pop(OURS, 0),
            "sglang": dict(sorted(outcomes.items())),
        }
        for hook, outcomes in sorted(snapshot.items())
    }


def failed_hooks() -> dict[str, str]:
    """Hooks switched off in this process by an error of ours, with the error."""
    with _lock:
        return dict(_failed)


def reset() -> None:
    """Forget the counts and failures (tests)."""
    with _lock:
        _counts.clear()
        _failed.clear()
        _captured.clear()


def _report_at_exit() -> None:
    print(f"dsv41-kernels fire counts: {json.dumps(fire_counts())}", file=sys.stderr, flush=True)


def arm_exit_report(environ=os.environ) -> None:
    """Print the counts at exit when ``DSV41_KERNELS_REPORT`` is set to 1."""
    if environ.get(REPORT_ENV, "").strip() == "1":
        atexit.register(_report_at_exit)

"""The Triton interpreter: whether this process's kernels run in it, and the turn-taking it needs.

``triton.jit`` decides when it decorates a kernel, from its own reading of ``TRITON_INTERPRET``
(``1``, ``true``, ``yes``, ``on`` in any case mean the interpreter; ``0``, ``false``, ``2``, a
space mean compiled kernels), whether that kernel is compiled or interpreted.
:data:`RUNS_IN_INTERPRETER` is that same decision, taken by ``triton.jit`` itself on a probe
when this module is first imported, which every op module does before it defines a kernel. The
admissions and ``dsv41-kernels check`` use it, so they agree with the kernels even when the
variable is spelled differently or changed after import.

The interpreter rewires ``triton.language`` for the whole process while a launch runs, so two
threads interpreting at once break each other's kernels (and leave Triton's module state
wrong); :func:`serialized` makes our launches take turns. Compiled launches need no lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np
import triton
from triton.runtime.interpreter import InterpretedFunction


def kernels_interpreted() -> bool:
    """Whether a kernel defined now would run in the interpreter: ``triton.jit``'s answer."""

    @triton.jit
    def probe():
        pass

    return isinstance(probe, InterpretedFunction)


RUNS_IN_INTERPRETER = kernels_interpreted()
_turn = threading.RLock()


def triton_interpreter() -> bool:
    """True when this process's Triton kernels run in the CPU interpreter."""
    return RUNS_IN_INTERPRETER


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def interpreter_unusable(
    triton_version: str = triton.__version__, numpy_version: str = np.__version__
) -> str | None:
    """Why this Triton's interpreter cannot run the kernels, or None. Triton 3.6's interpreter
    converts arrays to Python scalars the way numpy 2.4 no longer allows (``TypeError: only
    0-dimensional arrays ...`` in a third of the kernels); 3.7 does not."""
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (
            f"triton {triton_version}'s interpreter fails on numpy {numpy_version} "
            "(triton >= 3.7 or numpy < 2.4 runs it)"
        )
    return None


@contextlib.contextmanager
def serialized() -> Iterator[None]:
    """Hold the interpreter's turn for a launch (a no-op for compiled kernels). The interpreter
    runs a kernel's float arithmetic in numpy, which warns where IEEE arithmetic on the GPU just
    yields NaN or Inf (``inf * 0``): the kernel's contract covers those values, so the warnings
    are silenced for the launch rather than reaching the caller."""
    if not RUNS_IN_INTERPRETER:
        yield
        return
    with _turn, np.errstate(all="ignore"):
        yield

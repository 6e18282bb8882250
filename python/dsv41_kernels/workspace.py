"""Per-stream workspaces: tensors a kernel keeps its state in from one launch to the next.

The argmax's slots and ticket (and the CUDA accept's tagged slots and tickets) are right only
if no two launches that share them run at once. Launches on one CUDA stream never do, so every
stream gets its own workspace: callers on several streams, ordered or not, never share one.
Under the Triton interpreter (CPU tensors) launches take turns
(:func:`dsv41_kernels.interpreter.serialized`), so one workspace per device serves every thread.

A workspace is made on the first call on its stream, which must not be inside CUDA-graph
capture (memory made during capture belongs to the graph's pool). A capture on a stream that
has none (a warm-up on one stream, then a capture on another, as ``torch.cuda.graph`` and
SGLang's sampling graphs do) uses the device's first workspace, which the graph then shares
with the stream that made it: replay such a graph ordered with that stream's work.

An interpreted launch can stop halfway (an interrupt, an error in one program), leaving slots
filled and the ticket counted; :meth:`StreamWorkspace.launch` then refills the workspace with
its initial values before the exception goes on. A GPU launch is queued whole or not at all.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import NamedTuple

import torch

from dsv41_kernels.interpreter import serialized


class Buffer(NamedTuple):
    """One tensor of a workspace: 1-D, ``size`` elements of ``dtype``, made (and reset) as
    ``fill``, the value it holds between launches."""

    size: int
    dtype: torch.dtype
    fill: int


class StreamWorkspace:
    """``owner``'s workspace on each (device, stream): one tensor per :class:`Buffer`."""

    def __init__(self, owner: str, *buffers: Buffer):
        self.owner = owner
        self.buffers = buffers
        self._made: dict[tuple[torch.device, int | None], tuple[torch.Tensor, ...]] = {}
        self._first: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        self._lock = threading.Lock()

    def get(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The workspace of ``device``'s current stream (made on its first call)."""
        on_cuda = device.type == "cuda"
        key = (device, torch.cuda.current_stream(device).cuda_stream if on_cuda else None)
        tensors = self._made.get(key)
        if tensors is not None:
            return tensors
        with self._lock:
            if key in self._made:
                return self._made[key]
            if on_cuda and torch.cuda.is_current_stream_capturing():
                if device not in self._first:
                    raise RuntimeError(
                        f"{self.owner}: its workspace is made on the first call, which must "
                        f"not be inside CUDA-graph capture; call {self.owner} once on "
                        f"{device} before capturing"
                    )
                return self._first[device]  # not recorded: eager calls here get their own
            tensors = tuple(
                torch.full((b.size,), b.fill, dtype=b.dtype, device=device) for b in self.buffers
            )
            self._first.setdefault(device, tensors)
            self._made[key] = tensors
            return tensors

    @contextlib.contextmanager
    def launch(self, device: torch.device) -> Iterator[tuple[torch.Tensor, ...]]:
        """The workspace for one launch, in the interpreter's turn; an interpreted launch that
        raises leaves it as made."""
        with serialized():
            tensors = self.get(device)
            try:
                yield tensors
            except BaseException:
                if device.type == "cpu":
                    for t, b in zip(tensors, self.buffers):
                        t.fill_(b.fill)
                raise

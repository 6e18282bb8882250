"""The sharded ops' scratch: a set of buffers per call in flight, never shared by two.

A call of :func:`.sharded_row_argmax.sharded_row_argmax` (or its accept form) writes the
shard's argmax, reads it back into keys, all-gathers the keys and merges them: four steps, and
another call must not touch the buffers in between. Each call therefore borrows a set of its
own from a free list of its device and stream and gives it back once its work is queued: a
later call on that stream runs after it (stream order; on the CPU the work is done when the
call returns). Calls in flight at once (threads, on one stream or several) hold a set each; a
free list grows to the most calls its stream ever had in flight at once.

Sets are made on eager calls only, never inside CUDA-graph capture (memory made there belongs
to the graph's pool). A capture takes a free set of the capturing stream, else one of another
stream of the device (``torch.cuda.graph`` captures on its own stream after warm-up calls on
the current one, and synchronizes the device first), which then stays with the capturing
stream: the graph replays with it while eager calls elsewhere use sets of their own. Graphs
captured on one stream share its sets, as they would share static buffers: replay them in
order. A capture that finds no free set on its device raises: call the op once, eagerly, before
capturing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

Scratch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Local indices and keys (int64 ``[rows]`` each) and the gathered keys (int64 ``[world * rows]``
)."""


class ScratchPool:
    """Free sets of ``rows``-row scratch per (device, stream, world size)."""

    def __init__(self, owner: str, rows: int):
        self.owner = owner
        self.rows = rows
        self._free: dict[tuple[torch.device, int | None, int], list[Scratch]] = {}
        self._lock = threading.Lock()

    def _take(self, device: torch.device, world: int):
        on_cuda = device.type == "cuda"
        key = (device, torch.cuda.current_stream(device).cuda_stream if on_cuda else None, world)
        with self._lock:
            free = self._free.setdefault(key, [])
            if free:
                return key, free.pop()
            if on_cuda and torch.cuda.is_current_stream_capturing():
                for (other_device, _, other_world), sets in self._free.items():
                    if other_device == device and other_world == world and sets:
                        return key, sets.pop()  # given back to the capturing stream
                raise RuntimeError(
                    f"{self.owner}: no free scratch on {device} for this CUDA-graph capture "
                    f"(its buffers are made outside capture); call {self.owner} once on "
                    f"{device}, eagerly, with a group of {world} ranks, before capturing"
                )
        sizes = (self.rows, self.rows, world * self.rows)
        return key, tuple(torch.zeros(n, dtype=torch.int64, device=device) for n in sizes)

    @contextlib.contextmanager
    def borrow(self, device: torch.device, world: int) -> Iterator[Scratch]:
        """A set of this call's own on ``device``'s current stream, for ``world`` ranks."""
        key, scratch = self._take(device, world)
        try:
            yield scratch
        finally:
            with self._lock:
                self._free[key].append(scratch)

"""CUDA-graph replay timing shared by ``dsv41-kernels check`` and ``benchmark/``.

Launch overhead from Python would swamp microsecond kernels, so a function is captured
``inner`` times into one CUDA graph and the graph is replayed; the figure is the median
over ``repeats`` timed replays of the per-call time, in microseconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def graph_time_us(
    fn: Callable[[], object], *, inner: int = 100, repeats: int = 20, warmup: int = 3
) -> float:
    """Median microseconds per ``fn()`` call under CUDA-graph replay on the current device."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):  # compile, allocate workspaces and caches outside capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(samples)

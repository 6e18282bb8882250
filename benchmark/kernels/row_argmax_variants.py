"""The row argmax's launch-shape sweep (``bench_row_argmax.py --sweep``): its CUDA kernels at the
shapes the production ones were chosen among, fp32, checked and timed.

The kernels come from ``row_argmax_sweep.cu`` beside this file, built here on first use (never
prebuilt, never shipped) from the same headers as the op's module; each shape is planned by the
op's own rule (:func:`~dsv41_kernels.ops.speculative.argmax_plan.cluster_launch`,
:func:`~dsv41_kernels.ops.speculative.argmax_plan.cta_a_row_launch`) over the sweep module's
occupancy.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from common import build_beside, timed

from dsv41_kernels.ops.speculative.argmax_plan import (
    CUDA_KERNEL_IDS,
    ArgmaxKernel,
    CudaLaunch,
    Occupancy,
    cluster_launch,
    cta_a_row_launch,
)

SOURCE = Path(__file__).with_name("row_argmax_sweep.cu")
VOCAB = 129280
CLUSTER_SHAPES = ((128, 16), (256, 8), (256, 16), (512, 4), (512, 8), (1024, 2))
"""(threads, vectors a thread) of the cluster kernel, timed at :data:`CLUSTER_ROWS` rows."""
CTA_A_ROW_SHAPES = ((128, 8), (256, 4), (256, 8), (512, 2), (512, 4), (512, 8), (1024, 2))
CTA_A_ROW_SHAPES += ((1024, 4),)
"""(threads, vectors a batch) of the one-CTA-a-row kernel, timed at :data:`CTA_A_ROW_ROWS`."""
CLUSTER_ROWS = (1, 6, 64)
CTA_A_ROW_ROWS = (96, 128, 256, 384)


@functools.cache
def sweep_module(device_index: int = 0):
    """``row_argmax_sweep.cu`` built for the device's arch, loaded (:func:`common.build_beside`)."""
    return build_beside(SOURCE, device_index)


def sweep_occupancy(module, logits: torch.Tensor) -> Occupancy:
    """The sweep kernels' occupancy for ``logits``' device, as the module answers."""

    def occupancy(kernel: ArgmaxKernel, threads: int, vectors: int, cluster: int) -> int:
        kernel_id = CUDA_KERNEL_IDS[kernel]
        return module.row_argmax_sweep_resident_ctas(logits, kernel_id, threads, vectors, cluster)

    return occupancy


def sweep_launch(kernel: ArgmaxKernel, logits: torch.Tensor, threads: int, vectors: int, module):
    """The launch shape the op's rule gives ``kernel`` at ``threads`` x ``vectors`` (one CTA a
    row past one wave: no early start)."""
    rows, vocab = logits.shape
    occupancy = sweep_occupancy(module, logits)
    if kernel == ArgmaxKernel.CLUSTER_A_ROW:
        return cluster_launch(rows, vocab, logits.element_size(), threads, vectors, occupancy)
    launch = cta_a_row_launch(rows, threads, vectors, occupancy)
    return launch or CudaLaunch(threads, vectors, 0, False)


def sweep() -> list[dict]:
    """Every sweep shape at its row counts, on fp32 logits full of ties: checked against
    torch.argmax and timed."""
    records = []
    module = sweep_module(torch.cuda.current_device())
    kernels = (
        (ArgmaxKernel.CLUSTER_A_ROW, "cluster", CLUSTER_ROWS, CLUSTER_SHAPES),
        (ArgmaxKernel.CTA_A_ROW, "rows", CTA_A_ROW_ROWS, CTA_A_ROW_SHAPES),
    )
    for kernel, name, row_counts, shapes in kernels:
        for rows in row_counts:
            x = torch.randn(rows, VOCAB, device="cuda")
            x[:, ::97] = x.max()  # ties everywhere
            ref = torch.argmax(x, dim=-1)
            out = torch.empty(rows, dtype=torch.int64, device="cuda")
            for threads, vectors in shapes:
                c = sweep_launch(kernel, x, threads, vectors, module)
                shape_args = (CUDA_KERNEL_IDS[kernel], threads, vectors, c.cluster, c.early_start)

                def run(x=x, out=out, args=shape_args):
                    module.row_argmax_sweep(x, out, *args)

                run()
                shape = f"[{rows}, {VOCAB}] fp32, ties"
                arm = f"cuda {name} {threads}x{vectors}"
                records.append(timed("row_argmax", shape, arm, run, exact=torch.equal(out, ref)))
    return records

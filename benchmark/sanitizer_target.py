"""A short run of the two cluster kernels for ``compute-sanitizer`` (memcheck, racecheck).

Eight calls of the fused combine (m = 6, H = 5120) and eight of the greedy accept (bs 1, n 6,
vocab 129280, a cutoff), through the public ops, on a CUDA GPU:
    compute-sanitizer --tool memcheck python3 benchmark/sanitizer_target.py
    compute-sanitizer --tool racecheck python3 benchmark/sanitizer_target.py
"""

from __future__ import annotations

import torch

from dsv41_kernels.cases.hc_combine_norm import example_inputs
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm_mxfp8
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy


def main() -> None:
    x, pre, weight = example_inputs(6, 5120, "cuda", seed=6)
    for _ in range(8):
        hc_combine_norm_mxfp8(x, pre, weight, 1e-6)
    logits = torch.randn(6, 129280, device="cuda")
    candidates = torch.zeros(1, 6, dtype=torch.int64, device="cuda")
    cutoff = torch.full((1,), 5, dtype=torch.int32, device="cuda")
    for _ in range(8):
        accept_greedy(candidates, logits, cutoff_verify_lens=cutoff)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

import sys, torch
from dsv41_kernels.ops.layernorm.hc_combine_norm import example_inputs
from dsv41_kernels import hc_combine_norm_mxfp8, accept_greedy
xx, pre, w = example_inputs(6, 5120, "cuda", seed=6)
for _ in range(8):
    hc_combine_norm_mxfp8(xx, pre, w, 1e-6)
x = torch.randn(6, 129280, device="cuda")
cand = torch.zeros(1, 6, dtype=torch.int64, device="cuda")
for _ in range(8):
    accept_greedy(cand, x, cutoff_verify_lens=torch.full((1,), 5, dtype=torch.int32, device="cuda"))
torch.cuda.synchronize()

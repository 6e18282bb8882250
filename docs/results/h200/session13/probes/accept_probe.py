"""Session 13, call 2: the greedy accept (n 6, vocab 129280, fp32, a cutoff) in three forms of
row_argmax.cu: as built (the prebuilt module, through the op), accept_moved and accept_rows2
(make_accept_variants.sh), at bs 1-64; CUDA-graph medians, each result against the torch
composition."""

import json, sys
import torch
import tvm_ffi
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy, accept_greedy_torch

variants = {
    name: getattr(tvm_ffi.load_module(f"{sys.argv[2]}/{name}.so"), f"{name}_accept_greedy_cluster")
    for name in ("accept_moved", "accept_rows2")
}
rows, wrong = [], []
for bs in (1, 4, 8, 16, 24, 32, 44, 64):
    g = torch.Generator(device="cuda").manual_seed(bs)
    logits = torch.randn(bs * 6, 129280, device="cuda", generator=g)
    predict = torch.argmax(logits, -1).view(bs, 6)
    cand = torch.randint(0, 129280, (bs, 6), device="cuda", generator=g)
    cand[:, 1:4] = predict[:, :3]
    cutoff = torch.randint(1, 8, (bs,), dtype=torch.int32, device="cuda", generator=g)
    ref = accept_greedy_torch(cand, logits, cutoff)
    out = (
        torch.empty(bs, dtype=torch.int32, device="cuda"),
        torch.empty(bs, dtype=torch.int64, device="cuda"),
        torch.empty(bs, dtype=torch.int32, device="cuda"),
    )
    arms = {"built": lambda: accept_greedy(cand, logits, cutoff_verify_lens=cutoff, out=out)}
    for name, fn in variants.items():
        slots = torch.full((16 * bs,), -1, dtype=torch.int64, device="cuda")
        tickets = torch.zeros(bs, dtype=torch.int64, device="cuda")
        arms[name] = lambda fn=fn, slots=slots, tickets=tickets: fn(
            cand, logits, cutoff, *out, slots, tickets
        )
    line = {}
    for name, fn in arms.items():
        for o in out:
            o.fill_(-7)
        fn()
        if not all(torch.equal(a, b) for a, b in zip(out, ref)):
            wrong.append(f"bs {bs} {name}")
        line[name] = graph_time_us(fn)
        if not all(torch.equal(a, b) for a, b in zip(out, ref)):
            wrong.append(f"bs {bs} {name} after replays")
    rows.append({"bs": bs, **line})
    print(f"bs {bs:3d} " + " | ".join(f"{k} {v:.2f}" for k, v in line.items()), flush=True)
print(f"results differing from the torch composition: {wrong or 'none'}", flush=True)
json.dump({"rows": rows, "wrong": wrong}, open(sys.argv[1], "w"), indent=1)

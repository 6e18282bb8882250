"""SGLang's static verify epilogue vs the one-launch accept_greedy_epilogue.

DSpark verifies n = 6 rows of vocab 129280 per request; bs 1, 2, 4, 8, 16, 32, 64 (captured
verify batch sizes), gated as a V4.1 server folds the KV commit. Arms: ``torch`` (the
contract in torch ops, the op's fallback), ``sglang-0.5.23`` (SGLang's own
``DsparkVerifyEpilogue._accept_static_greedy`` for a V4.1 target: its split-vocab argmax,
inexact on NaN, the accept rule, ``build_accept_outs`` into its static buffers and the gate,
14 to 17 launches) and ``ours`` (the public op into the same buffers: the accept's CUDA kernels
on sm_90+, else its Triton kernel; the record names the kernel), checked equal first (random
logits, no NaN). Run where SGLang imports without the plugin loaded (its arm is SGLang's own
code then):

    python benchmark/kernels/bench_accept_greedy_epilogue.py --json bench_epilogue.json
"""

from __future__ import annotations

import torch
from common import parser, report, sglang_arm, sglang_module, timed

from dsv41_kernels.ops.speculative.accept_greedy_epilogue import (
    EpilogueOuts,
    accept_greedy_epilogue,
    accept_greedy_epilogue_admission,
    epilogue_torch,
    new_outputs,
)

VOCAB = 129280
N = 6


def outputs(bs: int) -> EpilogueOuts:
    return new_outputs(bs, N, "cuda")


def equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def sglang_epilogue(bs, candidates, logits, seq_lens):
    """``(run, buffers, None)``: SGLang's epilogue of ``bs`` requests on these inputs, and its
    static buffers; or ``(None, None, why)`` where SGLang does not import here."""
    module, why = sglang_module("sglang.srt.speculative.dspark_components.dspark_verify")
    if module is None:
        return None, None, why
    from dsv41_kernels.calibration import callers

    epilogue = callers.verify_epilogue(bs, "cuda")
    epilogue.begin_static_step(bs, True)
    io = callers.static_verify_io(logits, candidates, seq_lens)
    run = lambda: epilogue._accept_static_greedy(
        io, verify_lens=epilogue.verify_lens_buf[:bs], gate=epilogue.inject_gate_buf, gated=True
    )
    return run, epilogue, None


def measure(bs: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(bs)
    logits = torch.randn(bs * N, VOCAB, device="cuda", generator=gen)
    predict = logits.argmax(-1).view(bs, N)
    candidates = torch.zeros(bs, N, dtype=torch.int64, device="cuda")
    candidates[:, 1:] = predict[:, :-1]
    candidates[::2, 3] += 1  # every other request rejects at its third draft
    seq_lens = torch.randint(1, 1 << 16, (bs,), device="cuda", generator=gen)
    verify_lens = torch.full((bs,), N, dtype=torch.int64, device="cuda")
    gate = torch.ones(1, dtype=torch.int32, device="cuda")
    inputs = (candidates, logits, seq_lens, verify_lens, gate)
    ours_out, torch_out = outputs(bs), outputs(bs)
    ref = tuple(t.clone() for t in epilogue_torch(*inputs, torch_out))
    shape = f"bs {bs} x n {N} x {VOCAB} fp32, gated"
    kernel = accept_greedy_epilogue_admission(*inputs, out=ours_out).kernel
    run, epilogue, why = sglang_epilogue(bs, candidates, logits, seq_lens)
    exact = None
    if run is not None:
        gated = run()
        buffers = epilogue.read_accept(bs)
        theirs = (*(getattr(buffers, f) for f in EpilogueOuts._fields[:6]), gated)
        exact = equal(theirs, ref)
    records = [sglang_arm("accept_greedy_epilogue", shape, run, why, run, exact=exact)]
    arms = {
        "torch": lambda: epilogue_torch(*inputs, torch_out),
        "ours": lambda: accept_greedy_epilogue(*inputs, out=ours_out),
    }
    for arm, fn in arms.items():
        fields = {"exact": equal(fn(), ref), "kernel": kernel if arm == "ours" else None}
        records.append(timed("accept_greedy_epilogue", shape, arm, fn, **fields))
    return records


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--bs", default="1,2,4,8,16,32,64")
    args = p.parse_args()
    records = [r for bs in map(int, args.bs.split(",")) for r in measure(bs)]
    report(records, args.json, baseline="torch")


if __name__ == "__main__":
    main()

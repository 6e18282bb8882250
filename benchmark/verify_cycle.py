"""The ops this project replaces, in the order and count of one DeepSeek-V4.1-Flash DSpark
verify cycle at BS=1, each arm captured in one CUDA graph: baseline vs ours.

One cycle (anchors.md): one greedy accept over the ``[6, 129280]`` fp32 verify logits; 40
layers of mHC combine+norm followed by the MXFP8 quantizer (6 rows, H = 5120); four FlashMLA
scheduler-metadata launches (6 query rows, 64 heads); 40 vision routers (6 tokens, 384
experts, top-6) followed by the id packing. Both arms use dsv41_kernels only:

========================  ============================================  ==========================
op                        baseline                                      ours
========================  ============================================  ==========================
greedy accept             torch.argmax + the accept rule in torch ops   one-launch accept_greedy
combine+norm -> MXFP8     hc_combine_norm, then mxfp8_quantize          hc_combine_norm_mxfp8
scheduler metadata        baseline_decoding_sched_meta (FlashMLA's      decoding_sched_meta
                          one-thread walk)                              (block-parallel)
vision router -> packed   moe_fused_gate, then pack_topk                moe_fused_gate(packed_out)
========================  ============================================  ==========================

Every layer has its own inputs and outputs (preallocated), so the cycle reads what a real
one reads. Prints the saving per verify cycle in µs, in total and per op (each op group also
timed alone, the same way), and with ``--json PATH`` writes the records.

    python benchmark/verify_cycle.py --json $OUT/verify_cycle.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dsv41_kernels.cases.decoding_sched_meta import baseline_decoding_sched_meta
from dsv41_kernels.cases.hc_combine_norm import example_inputs
from dsv41_kernels.ops.attention.decoding_sched_meta import (
    DecodingSchedConfig,
    decoding_sched_meta,
    device_sched_config,
)
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm, hc_combine_norm_mxfp8
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, pack_topk
from dsv41_kernels.ops.quantization.mxfp8_quantize import Mxfp8SwizzledInput, mxfp8_quantize
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy, accept_greedy_torch
from dsv41_kernels.reference.mxfp8 import scale_buffer_size
from dsv41_kernels.timing import graph_time_us

# DeepSeek-V4.1-Flash at BS=1 with DSpark block 5 (anchors.md).
VERIFY_ROWS = 6
VOCAB = 129280
LAYERS = 40
HIDDEN = 5120
EPS = 1e-6
SCHED_LAUNCHES = 4
HEADS = 64
INDEX_TOPK = 512
EXPERTS = 384
TOP_K = 6
IMAGE_TOKEN_ID = 129264


def accept_group(device):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(VERIFY_ROWS, VOCAB, generator=gen).to(device)
    predict = torch.argmax(logits, -1)
    candidates = torch.cat([predict[:1], predict[:-1]]).view(1, VERIFY_ROWS)
    candidates[0, 4] += 1  # three draft tokens accepted, then a rejection
    out = (
        torch.empty(1, dtype=torch.int32, device=device),
        torch.empty(1, dtype=torch.int64, device=device),
        torch.empty(1, dtype=torch.int32, device=device),
    )
    check = (accept_greedy(candidates, logits), accept_greedy_torch(candidates, logits))
    if not all(torch.equal(a, b) for a, b in zip(*check, strict=True)):
        raise AssertionError("accept_greedy differs from the torch.argmax-based accept")
    return (
        lambda: accept_greedy_torch(candidates, logits, None, out),
        lambda: accept_greedy(candidates, logits, out=out),
    )


def combine_group(device):
    layers = []
    for layer in range(LAYERS):
        x, pre, weight = example_inputs(VERIFY_ROWS, HIDDEN, device, seed=layer)
        y = torch.empty(VERIFY_ROWS, HIDDEN, dtype=torch.bfloat16, device=device)
        quantized = Mxfp8SwizzledInput(
            torch.empty(VERIFY_ROWS, HIDDEN, dtype=torch.float8_e4m3fn, device=device),
            torch.empty(
                scale_buffer_size(VERIFY_ROWS, HIDDEN, swizzled=True),
                dtype=torch.uint8,
                device=device,
            ),
        )
        layers.append((x, pre, weight, y, quantized))

    def baseline():
        for x, pre, weight, y, _ in layers:
            mxfp8_quantize(hc_combine_norm(x, pre, weight, EPS, out=y))

    def ours():
        for x, pre, weight, y, quantized in layers:
            hc_combine_norm_mxfp8(x, pre, weight, EPS, out=(y, quantized))

    return baseline, ours


def sched_group(device):
    parts, overhead = device_sched_config(device, s_q=VERIFY_ROWS, h_q=HEADS)
    gen = torch.Generator().manual_seed(1)
    launches = []
    for _ in range(SCHED_LAUNCHES):
        lengths = torch.randint(1, INDEX_TOPK + 1, (1,), generator=gen, dtype=torch.int32)
        meta = torch.empty(parts, 8, dtype=torch.int32, device=device)
        splits = torch.empty(2, dtype=torch.int32, device=device)
        launches.append((meta, splits, lengths.to(device)))
    config = DecodingSchedConfig(topk=INDEX_TOPK, fixed_overhead_num_blocks=overhead)

    def run(kernel):
        for meta, splits, lengths in launches:
            kernel(meta, splits, config, topk_length=lengths)

    return (lambda: run(baseline_decoding_sched_meta), lambda: run(decoding_sched_meta))


def router_group(device):
    layers = []
    for layer in range(LAYERS):
        gen = torch.Generator().manual_seed(100 + layer)
        logits = torch.randn(VERIFY_ROWS, EXPERTS, generator=gen).to(device)
        bias = (0.1 * torch.randn(EXPERTS, generator=gen)).to(device)
        bias_alt = (0.1 * torch.randn(EXPERTS, generator=gen)).to(device)
        ids = torch.randint(0, 1000, (VERIFY_ROWS,), generator=gen)
        ids[::2] = IMAGE_TOKEN_ID
        outputs = (
            torch.empty(VERIFY_ROWS, TOP_K, dtype=torch.float32, device=device),
            torch.empty(VERIFY_ROWS, TOP_K, dtype=torch.int32, device=device),
            torch.empty(VERIFY_ROWS, TOP_K, dtype=torch.int32, device=device),
        )
        layers.append((logits, bias, bias_alt, ids.to(device), outputs))

    def route(layer, packed):
        logits, bias, bias_alt, ids, (weights, topk_ids, packed_ids) = layer
        return moe_fused_gate(
            logits,
            bias,
            bias_alt=bias_alt,
            input_ids=ids,
            image_token_id=IMAGE_TOKEN_ID,
            top_k=TOP_K,
            routed_scaling_factor=1.5,
            packed_out=packed_ids if packed else None,
            out_weights=weights,
            out_ids=topk_ids,
        )

    def baseline():
        for layer in layers:
            pack_topk(*route(layer, packed=False)[::-1])

    def ours():
        for layer in layers:
            route(layer, packed=True)

    return baseline, ours


GROUPS = (
    ("greedy accept [6, 129280]", 1, accept_group),
    ("combine+norm -> MXFP8 (m=6, H=5120)", LAYERS, combine_group),
    ("FlashMLA scheduler metadata", SCHED_LAUNCHES, sched_group),
    ("vision router -> packed ids (T=6, E=384)", LAYERS, router_group),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--repeats", type=int, default=20, help="timed graph replays")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("verify_cycle.py needs a CUDA GPU")
    device = torch.device("cuda")
    arms = [(name, count, *build(device)) for name, count, build in GROUPS]

    def cycle(arm):  # arm 0: baseline, 1: ours
        def run():
            for group in arms:
                group[2 + arm]()

        return run

    # One whole cycle per graph (inner=1): ~170 launches, so launch gaps are as in a real one.
    records = []
    for name, count, baseline, ours in arms:
        records.append(
            {
                "op": name,
                "per_cycle": count,
                "baseline_us": graph_time_us(baseline, inner=1, repeats=args.repeats),
                "ours_us": graph_time_us(ours, inner=1, repeats=args.repeats),
            }
        )
    records.append(
        {
            "op": "verify cycle (all of the above, one graph)",
            "per_cycle": 1,
            "baseline_us": graph_time_us(cycle(0), inner=1, repeats=args.repeats),
            "ours_us": graph_time_us(cycle(1), inner=1, repeats=args.repeats),
        }
    )
    for r in records:
        r["saving_us"] = r["baseline_us"] - r["ours_us"]
    print(f"{torch.cuda.get_device_name()}, DeepSeek-V4.1-Flash verify cycle at BS=1")
    print(f"{'op':<44} {'x':>3} {'baseline us':>12} {'ours us':>9} {'saving us/cycle':>16}")
    for r in records:
        print(
            f"{r['op']:<44} {r['per_cycle']:>3} {r['baseline_us']:>12.2f} "
            f"{r['ours_us']:>9.2f} {r['saving_us']:>16.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "records": records}, f, indent=2)


if __name__ == "__main__":
    main()

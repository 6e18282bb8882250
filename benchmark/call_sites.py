"""Every hooked SGLang 0.5.23 call site, SGLang's own function against the plugin's, per row count.

The figures the built-in H200 policy is decided from (``dsv41-kernels calibrate
--from-records``: a hook declines where ours is not faster than SGLang's own function by the
margin); its drivers, ``SITES``, also serve ``dsv41-kernels calibrate`` on a GPU. Each call
site is driven as its callers drive it, with SGLang's dispatch for DeepSeek-V4.1 on the GPU at
hand; the ``sglang-0.5.23`` arm takes our hooks out, the ``ours`` arm forces ours
(``DSV41_KERNELS_FORCE=all``) so both are timed at every row count. CUDA-graph replay,
median. Rows are the row counts the call sites see: 6 per request at verify for the accept,
the tokens of a forward for the mHC and the router, 6 per request for the scheduler. A record's
``op`` is the op the hook runs, ``call_site`` SGLang's function, ``rows`` its row count.

    python -m benchmark.call_sites --record [--sites accept_greedy,hc_combine_norm] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from benchmark import record as results
from benchmark.kernels.common import OURS_ARM, SGLANG_ARM, record
from test.sglang import callers

from dsv41_kernels.timing import graph_time_us

ARMS = (SGLANG_ARM, OURS_ARM)
ACCEPT_BS = (1, 2, 4, 8, 16, 32, 64)
ARGMAX_ROWS = (1, 6, 8, 16, 32, 64, 96, 128, 256, 384)
MHC_ROWS = (1, 2, 6, 12, 24, 31, 32, 64, 96, 128, 192, 256) + (512, 1024, 2048, 4096, 8192)
MHC_ROWS += (16384, 65536)
ROUTER_TOKENS = (1, 6, 16, 64, 256, 320, 512, 1024, 2048, 2560, 4096, 16384)
SCHED_BS = (1, 4, 16, 64)
WO_A_TOKENS = (6, 24, 96, 384)


def timed(fn, rows):
    """Fewer captured calls per graph for the big shapes (a graph of 100 would take seconds)."""
    inner = 100 if rows <= 1024 else (20 if rows <= 8192 else 5)
    return graph_time_us(fn, inner=inner, repeats=20 if rows <= 8192 else 10)


def accept_cases(device):
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    for bs in ACCEPT_BS:
        gen = torch.Generator().manual_seed(bs)
        logits = callers.verify_logits(gen, bs, 129280, nan=False).to(device)
        kwargs = dict(
            candidates=callers.draft_candidates(logits, bs, gen),
            target_logits=logits,
            verify_num_draft_tokens=callers.VERIFY_ROWS,
            fused_argmax=True,
        )
        run = lambda kwargs=kwargs: dspark_accept.AcceptGreedy.execute(**kwargs)
        patch = (dspark_accept, ())
        yield "accept_greedy", f"bs {bs} x 6, vocab 129280", bs * callers.VERIFY_ROWS, run, patch


def argmax_cases(device):
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    for rows in ARGMAX_ROWS:
        logits = torch.randn(rows, 129280, generator=torch.Generator().manual_seed(rows))
        logits = logits.to(device)
        run = lambda logits=logits: dspark_accept._row_argmax(logits, fused=True)
        yield "row_argmax", f"[{rows}, 129280]", rows, run, (dspark_accept, ("_row_argmax",))


def mhc_cases(device, site):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    hc = callers.v41_decoder_layer(torch.Generator().manual_seed(0), device).attn_hc
    for rows in MHC_ROWS:
        gen = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, 4, callers.HIDDEN, generator=gen).bfloat16().to(device)
        if site == "hc_mix_stats":
            run = lambda x=x: mhc.mix_stats(hc, x)
            patch = (mhc, ("_mix_stats_impl",))
        else:
            pre = (torch.rand(rows, 4, generator=gen) + 0.1).to(device)
            run = lambda x=x, pre=pre: mhc.combine(hc, mhc.HcState(x, pre))
            patch = (mhc, ("_combine",))
        yield site, f"[{rows}, 4, 5120] bf16", rows, run, patch


def router_cases(device):
    from sglang.srt.models import deepseek_v2

    moe = callers.vision_moe(torch.Generator().manual_seed(5), device)
    for tokens in ROUTER_TOKENS:
        gen = torch.Generator().manual_seed(tokens)
        ids = torch.randint(0, 129000, (tokens,), generator=gen)
        ids[::2] = callers.IMAGE_TOKEN_ID
        logits = torch.randn(tokens, callers.EXPERTS, generator=gen).to(device)
        ids = ids.to(device)
        run = lambda logits=logits, ids=ids: deepseek_v2.vision_topk(moe, logits, ids)
        patch = (deepseek_v2, ("vision_topk",))
        yield "moe_fused_gate", f"T {tokens}, E 384, top-6", tokens, run, patch


def sched_cases(device):
    decoder = callers.flashmla_decoder()
    caches = callers.v4_caches()
    for bs in SCHED_BS:
        b = callers.VERIFY_ROWS * bs
        step = callers.make_step(caches, b=b, topk=128, extra_topk=512, mode="random", seed=bs)

        def run(step=step):
            metadata = decoder.backend._create_flashmla_metadata()
            callers.sglang_decode(decoder, step, metadata, ours=True)

        patch = (decoder.backend, ("_maybe_precompute_flashmla_sched_meta",))
        shape = f"FlashMLA decode + schedule, b {b}, top-k 128+512"
        yield "decoding_sched_meta", shape, b, run, patch


def wo_a_cases(device):
    from sglang.srt.models import deepseek_v4

    for tp in (1, 2, 4):
        layer = callers.v41_attention_layer(tp, device)
        for tokens in WO_A_TOKENS:
            o, positions = callers.attention_output(layer, tokens, seed=tokens + tp)
            run = lambda layer=layer, o=o, p=positions: callers.attention_output_to_wo_a(
                layer, o, p
            )
            patch = (deepseek_v4, ("fused_rope_inplace", "sglang_per_token_group_quant_fp8"))
            shape = f"T {tokens}, TP {tp}: o [{tokens}, {64 // tp}, 512], G {8 // tp}"
            yield "inverse_rope_quant_fp8", shape, tokens, run, patch


SITES = {
    "accept_greedy": accept_cases,
    "row_argmax": argmax_cases,
    "hc_mix_stats": lambda device: mhc_cases(device, "hc_mix_stats"),
    "hc_combine_norm": lambda device: mhc_cases(device, "hc_combine_norm"),
    "moe_fused_gate": router_cases,
    "decoding_sched_meta": sched_cases,
    "inverse_rope_quant_fp8": wo_a_cases,
}
CALL_SITES = {
    "accept_greedy": "dspark_accept.AcceptGreedy.execute(fused_argmax=True)",
    "row_argmax": "dspark_accept._row_argmax(fused=True)",
    "hc_mix_stats": "deepseek_v4_mhc.mix_stats",
    "hc_combine_norm": "deepseek_v4_mhc.combine",
    "moe_fused_gate": "deepseek_v2.vision_topk",
    "decoding_sched_meta": "FlashMLA decode with its schedule (the backend's precompute)",
    "inverse_rope_quant_fp8": "MQALayer's inverse RoPE and FP8 quantizer before wo_a",
}
"""Each op's SGLang 0.5.23 call site, as the records and the report name it."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the records here")
    results.add_argument(parser)
    parser.add_argument("--sites", default=",".join(SITES), help="comma-separated ops")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("call_sites needs a CUDA GPU")
    os.environ["SGLANG_PLUGINS"] = "dsv41_kernels"
    os.environ["DSV41_KERNELS_FORCE"] = "all"  # time ours everywhere, measured-slower or not
    from test.sglang.cpu_import import import_sglang

    import_sglang()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from dsv41_kernels.sglang_plugin import dispatch

    device = torch.device("cuda")
    name = torch.cuda.get_device_name()
    records = []
    print(f"{name}: SGLang 0.5.23's call sites, its function against ours (CUDA-graph medians, us)")
    print(f"{'op':<22} {'shape':<44} {'sglang-0.5.23':>14} {'ours':>14} {'ratio':>6}")
    for site in args.sites.split(","):
        for op, shape, rows, run, (module, names) in SITES[site](device):
            times = {}
            for arm in ARMS:
                dispatch.reset()
                try:
                    if arm == SGLANG_ARM:
                        with callers.sglang_functions(module, *names):
                            times[arm] = timed(run, rows)
                    else:
                        times[arm] = timed(run, rows)
                        counts = dispatch.fire_counts()
                        if any(c["sglang"] for c in counts.values()):
                            times[arm] = None  # ours declined here: not a time of ours
                            print(f"  {op} {shape}: ours declined {counts}", file=sys.stderr)
                except BaseException as e:  # an arm that cannot run (SGLang's tilelang absent, say)
                    if not (isinstance(e, Exception) or callers.sglang_cannot_run_here(e)):
                        raise
                    times[arm] = None
                    print(f"  {op} {shape} [{arm}]: {type(e).__name__}: {e}", file=sys.stderr)
                fields = {"call_site": CALL_SITES[site], "rows": rows}
                if op == "inverse_rope_quant_fp8":
                    fields["series"] = shape.split(":")[0].split(", ")[1]  # "TP 4"
                records.append(record(op, shape, arm, times[arm], **fields))
            base, ours = times[SGLANG_ARM], times[OURS_ARM]
            fmt = lambda us: "-" if us is None else f"{us:.2f}"
            ratio = "-" if None in (base, ours) else f"{ours / base:.3f}"
            print(f"{op:<22} {shape:<44} {fmt(base):>14} {fmt(ours):>14} {ratio:>6}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "records": records}, f, indent=2)
    if args.record is not None:
        results.append(records, args.record)


if __name__ == "__main__":
    main()

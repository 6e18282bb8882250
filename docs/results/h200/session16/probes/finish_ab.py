"""A/B in one process: the mHC finisher that reads its 24 mix columns back from global memory
after a barrier (`old`: out/ab/old_kernels.py, hc_mix_stats_kernels.py of commit fd3404a) against
the one that splits them out of its tile through shared memory (`new`: the tree of fd3404a with
probes/finish_split.diff applied), both after the same projection at the op's default launch
shapes. Not kept: the same bits, no faster (call 6). Outputs compared bit for bit first;
CUDA-graph medians, the best of 5, arms alternating. Run from the repository root:
python3 docs/results/h200/session16/probes/finish_ab.py OUT.json"""

import importlib.util
import json
import sys

import torch

from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc import hc_mix_stats_kernels as new
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.timing import graph_time_us

spec = importlib.util.spec_from_file_location("old_kernels", "out/ab/old_kernels.py")
old = importlib.util.module_from_spec(spec)
sys.modules["old_kernels"] = old
spec.loader.exec_module(old)
sms = torch.cuda.get_device_properties(0).multi_processor_count
records = []
cases = [("small_row", m) for m in (6, 31)]
cases += [("compensated", m) for m in (128, 256, 512, 1024, 2048, 4096)]
cases += [("batch_invariant", m) for m in (6, 1024)]
for path, m in cases:
    x, fn, scale, base = example_inputs(m, 5120, device="cuda", seed=m)
    weights = HcDerivedWeights(fn)
    x2d = x.flatten(1)
    cuda = path != "small_row"
    cfg = new.split_k_config(path, *x2d.shape, sms, cuda=cuda, wgmma=cuda)
    numerics = "tf32x3" if path == "small_row" else "compensated"
    runs = {
        name: (lambda mod=mod: mod.launch(
            x2d, fn, weights.lo, scale, base, numerics=numerics, cuda=cuda, cfg=cfg, iters=20,
            rms_eps=1e-6, eps=1e-6, post_mult=2.0, return_mix=True))
        for name, mod in (("old", old), ("new", new))
    }
    outs = {name: run() for name, run in runs.items()}
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
               for a, b in zip(outs["old"], outs["new"]))
    times = {name: [] for name in runs}
    for _ in range(5):
        for name, run in runs.items():
            times[name].append(graph_time_us(run))
    best = {name: min(t) for name, t in times.items()}
    print(f"{path:15s} m={m:5d}  old {best['old']:7.2f}  new {best['new']:7.2f}  "
          f"new/old {best['new'] / best['old']:.3f}  same bits {same}", flush=True)
    records.append({"path": path, "m": m, "config": str(cfg), "best": best, "all": times,
                    "same_bits": same})
json.dump(records, open(sys.argv[1], "w"), indent=1)

"""The harness every kernel benchmark here shares: one record schema, one table, one JSON file.

A record is one timing, a flat dict with at least

- ``op``: the op timed (``row_argmax``, ``hc_combine_norm_mxfp8``, ...);
- ``shape``: its inputs in the op's words (``[6, 129280] fp32``);
- ``arm``: what ran: ``ours``, a named baseline (``torch.argmax``, ``unfused pair``, ...), a
  launch shape of a sweep, or :data:`SGLANG_ARM` for SGLang's own kernel where it imports;
- ``us``: the CUDA-graph replay median in µs per call (:func:`dsv41_kernels.timing.graph_time_us`),
  or None when the arm could not be timed (``error`` says why);
- ``device``: the GPU's name;

and then the op's exactness fields (``exact``: bitwise equal to the reference or to the arm it
replaces; or a measure such as ``mix_rel_err``) and whatever else the benchmark keeps
(``kernel``, ``defects``, ...). :func:`report` prints the table (with ``speedup`` against a
baseline arm of the same op and shape), writes ``{"records": [...]}`` as JSON (``--json PATH``)
and appends the records with the run's metadata to the results file (``--record [PATH]``:
``benchmark/record.py``).

Run a benchmark as a script (``python benchmark/kernels/bench_row_argmax.py --record``):
Python puts this folder first on the path, which is how ``import common`` resolves.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from dsv41_kernels.timing import graph_time_us

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script: benchmark.record
    sys.path.append(str(Path(__file__).resolve().parents[2]))
from benchmark import record as results  # noqa: E402

SGLANG_ARM = "sglang-0.5.23"
"""The arm name of SGLang's own kernel for the same call, wherever it imports."""
OURS_ARM = "ours"
"""The arm name of this library's op as it runs by default."""
KEYS = ("op", "shape", "arm", "us", "device")


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def record(op: str, shape: str, arm: str, us: float | None, **fields) -> dict:
    return {"op": op, "shape": shape, "arm": arm, "us": us, "device": device_name(), **fields}


def timed(op: str, shape: str, arm: str, fn: Callable[[], object], **fields) -> dict:
    """The record of ``fn`` timed under CUDA-graph replay (``fields``: exactness and the rest).
    An arm that cannot be captured or timed is recorded with ``us`` None and the error."""
    try:
        return record(op, shape, arm, graph_time_us(fn), **fields)
    except Exception as e:  # a launch the compiler or the graph refuses: keep the others
        return record(op, shape, arm, None, **fields, error=f"{type(e).__name__}: {e}"[:200])


def sglang_module(module: str):
    """``(module, None)``: an SGLang 0.5.23 module; or ``(None, why)`` where SGLang does not
    import here (its arm is then recorded with ``us`` None and the reason)."""
    try:
        return importlib.import_module(module), None
    except Exception as e:  # ImportError, or whatever a half-importable SGLang raises
        return None, f"SGLang does not import here: {type(e).__name__}: {e}"[:200]


def sglang_function(module: str, name: str):
    """``(function, None)``: SGLang 0.5.23's own ``module.name``; or ``(None, why)``."""
    found, why = sglang_module(module)
    return (None, why) if found is None else (getattr(found, name), None)


def build_beside(source: Path, device_index: int = 0, *, flags=(), include_paths=()):
    """A benchmark-only CUDA source beside these scripts (a sweep's, a probe's or a reference's,
    never shipped) built for the device's arch into the just-in-time cache (a ninja build: again
    only when a source changed), with the package's headers on the include path (then
    ``include_paths``) and ``flags`` added, and loaded."""
    import os

    import tvm_ffi
    import tvm_ffi.cpp

    from dsv41_kernels.devices import device_arch
    from dsv41_kernels.jit import CACHE, CSRC, CUDA_CFLAGS, cuda_home

    arch = device_arch(device_index)
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = arch  # tvm-ffi reads its target from here
    if cuda_home():
        os.environ["CUDA_HOME"] = cuda_home()
    library = tvm_ffi.cpp.build(
        source.stem,
        sources=[str(source)],
        extra_cuda_cflags=[*CUDA_CFLAGS, *flags],
        extra_include_paths=[str(CSRC), *map(str, include_paths)],
        build_directory=str(CACHE / f"{source.stem}-{arch}"),
    )
    return tvm_ffi.load_module(library)


def flashinfer_norm_include() -> list[Path] | None:
    """The include paths of FlashInfer's staged RMSNorm headers (``tools/flashinfer_norm``), or
    None where they are not staged."""
    import os

    root = Path(
        os.environ.get("FLASHINFER_NORM_INCLUDE", Path(__file__).parents[2] / ".flashinfer_norm")
    )
    if not (root / "include" / "flashinfer" / "norm.cuh").is_file():
        return None
    return [root / "include", root / "stand_ins"]


def flashinfer_rmsnorm(device_index: int = 0):
    """FlashInfer's RMSNorm as ``sgl_kernel`` builds it for Hopper (``flashinfer_rmsnorm.cu``,
    ``-use_fast_math``), or None where its headers are not staged."""
    include = flashinfer_norm_include()
    if include is None:
        return None
    source = Path(__file__).with_name("flashinfer_rmsnorm.cu")
    module = build_beside(source, device_index, flags=("-use_fast_math",), include_paths=include)
    return module.flashinfer_rmsnorm


@contextlib.contextmanager
def sgl_kernel_rmsnorm(device_index: int = 0):
    """Where ``sgl_kernel`` is a stand-in (the H200's SGLang environment: its wheel does not
    load on torch 2.11), SGLang's ``RMSNorm`` CUDA branch (``layernorm.rmsnorm``) runs what
    ``sgl_kernel.rmsnorm`` is inside the block: FlashInfer's RMSNorm built with its fast-math
    flags (:func:`flashinfer_rmsnorm`; a new contiguous output, as ``sgl_kernel``'s). Elsewhere,
    or without FlashInfer's staged headers, nothing changes."""
    try:
        from sglang.srt.layers import layernorm
    except Exception:  # SGLang not importable: its arms record why themselves
        yield
        return
    if type(getattr(layernorm, "rmsnorm", None)).__name__ != "_PlaceholderMeta":
        yield
        return
    norm = flashinfer_rmsnorm(device_index)
    if norm is None:
        yield
        return

    def rmsnorm(x, weight, eps, out=None, enable_pdl=None):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
        norm(x, weight, y, eps)
        return y

    stand_in = layernorm.rmsnorm
    layernorm.rmsnorm = rmsnorm
    try:
        yield
    finally:
        layernorm.rmsnorm = stand_in


def sglang_group_quantizer():
    """``(quantize, None)``: SGLang's own ``sglang_per_token_group_quant_fp8(x, 32,
    scale_ue8m0=True)`` (not the plugin's hook), what an SM90 block-FP8 linear runs on its
    input, returning ``(q, scales)``; or ``(None, why)`` where SGLang does not import."""
    kernels, why = sglang_module("sglang.kernels.ops.quantization.fp8_kernel")
    if kernels is None:
        return None, why
    quantize = kernels.sglang_per_token_group_quant_fp8
    quantize = getattr(quantize, "__wrapped__", quantize)
    return functools.partial(quantize, group_size=32, scale_ue8m0=True), None


def groups_exact(quant_out, theirs) -> bool:
    """``quant_out`` is ``theirs`` (SGLang's quantizer's ``(q, scales)``), bit for bit."""
    from dsv41_kernels.cases.common import bit_mismatches

    ours = (quant_out[0].view(torch.uint8), quant_out[1])
    return bit_mismatches(ours, (theirs[0].view(torch.uint8), theirs[1])) == 0


def sglang_arm(op: str, shape: str, fn, why: str | None, run, **fields) -> dict:
    """The :data:`SGLANG_ARM` record: ``run`` timed, or the reason SGLang is absent."""
    if fn is None:
        return record(op, shape, SGLANG_ARM, None, error=why)
    return timed(op, shape, SGLANG_ARM, run, **fields)


class _Parser(argparse.ArgumentParser):
    """Keeps the parsed ``--record`` for :func:`report`, so a benchmark passes only ``--json``."""

    record_to: Path | bool | None = None

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        _Parser.record_to = parsed.record
        return parsed, rest


def parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments every benchmark takes (``--json PATH``, ``--record [PATH]``); add the
    op's own."""
    p = _Parser(description=description)
    p.add_argument("--json", type=Path, help="write the records here")
    results.add_argument(p)
    return p


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value else f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def table(records: Iterable[dict], *, baseline: str | None = None) -> str:
    """The records as one text table: the schema's columns, then every other field in the
    order first seen (``device`` left out: it heads the table); with ``baseline``, the
    speedup of each record over that arm's record of the same op and shape."""
    records = list(records)
    base = {(r["op"], r["shape"]): r["us"] for r in records if r["arm"] == baseline}
    columns = ["op", "shape", "arm", "us"]
    for r in records:
        columns += [k for k in r if k not in columns and k != "device"]
    if base:
        columns.insert(4, "speedup")
    rows = [columns]
    for r in records:
        ref = base.get((r["op"], r["shape"]))
        speedup = ref / r["us"] if ref and r["us"] else None
        rows.append([_cell(speedup if c == "speedup" else r.get(c)) for c in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"records": records}, indent=1) + "\n")


def report(records: list[dict], json_path: Path | None, *, baseline: str | None = None) -> None:
    """Print the table under a line naming the device and the timing; write the JSON; with
    ``--record``, append the records to the results file."""
    print(f"{device_name()}: CUDA-graph replay medians, us per call")
    print(table(records, baseline=baseline))
    if json_path is not None:
        write_json(json_path, records)
    if _Parser.record_to is not None:
        results.append(records, _Parser.record_to)

"""Every CUDA module built ahead of time, for the wheel: ``python -m dsv41_kernels.prebuild``.

Serving images often have no nvcc. The wheel therefore carries each ``sgl-kernel/csrc/<name>.cu``
built for each arch of :data:`dsv41_kernels.jit.PREBUILT_ARCHS` by
:func:`dsv41_kernels.jit.build_module`, the just-in-time path's own build, under the digest that
path looks for (:func:`dsv41_kernels.jit.module_digest`): a prebuilt module is exactly the one
the just-in-time path would have built. The folder (by default the package's ``prebuilt/``,
which git ignores; the wheel build fills its own) holds ``<name>-<digest>.so`` and the manifest
(:data:`dsv41_kernels.jit.MANIFEST`: per file its module, arch, CUDA and apache-tvm-ffi versions
and exported functions). Modules already built there, or in ``--reuse``, are not built again;
files of other digests (edited sources) are removed.

Torch-free, like :mod:`dsv41_kernels.jit`: ``setup.py`` runs it in the wheel's build environment.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from dsv41_kernels import jit

EXPORT_PREFIX = "__tvm_ffi_"
"""The prefix of the symbol ``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` exports for each function."""


def exported_functions(library: Path) -> list[str]:
    """The tvm-ffi functions a shared library exports, from its dynamic symbols (``nm``)."""
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    symbols = (line.split()[-1] for line in listing.splitlines() if line.strip())
    return sorted(s.removeprefix(EXPORT_PREFIX) for s in symbols if s.startswith(EXPORT_PREFIX))


def cuda_version() -> str:
    """The version of the CUDA toolkit that builds the modules, e.g. ``13.0``."""
    home = jit.cuda_home()
    nvcc = str(Path(home) / "bin" / "nvcc") if home else "nvcc"
    banner = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"release (\d+\.\d+)", banner)
    if found is None:
        raise RuntimeError(f"no CUDA release in `{nvcc} --version`: {banner!r}")
    return found.group(1)


def _build(name: str, arch: str, directory: str) -> tuple[str, float]:
    """One module, in a worker process (tvm-ffi takes its target from the environment)."""
    start = time.perf_counter()
    library = jit.build_module(name, arch, Path(directory))
    return str(library), time.perf_counter() - start


def prebuild(
    out: Path,
    archs: tuple[str, ...] = jit.PREBUILT_ARCHS,
    *,
    reuse: Path | None = None,
    jobs: int | None = None,
    log=print,
) -> dict[str, dict]:
    """Fill ``out`` with every module for every arch in ``archs`` and write its manifest;
    returns the manifest's entries. Raises RuntimeError when a module is to be built and nvcc
    or apache-tvm-ffi is missing."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = {
        jit.module_file(name, arch): (name, arch) for name in jit.module_names() for arch in archs
    }
    entries: dict[str, dict] = {}
    how: dict[str, str] = {}
    for folder, verb in ((out, "kept"), (reuse, "reused")):
        if folder is None:
            continue
        found = jit.read_manifest(folder)
        for file in wanted.keys() - entries.keys():
            if file in found and (folder / file).is_file():
                if folder != out:
                    shutil.copyfile(folder / file, out / file)
                entries[file], how[file] = found[file], verb
    missing = [file for file in wanted if file not in entries]
    if missing and not jit.toolchain_available():
        raise RuntimeError(
            f"{len(missing)} modules to build, which needs apache-tvm-ffi and nvcc "
            f"({jit.NO_TOOLCHAIN})"
        )
    if missing:
        cuda, tvm_ffi = cuda_version(), jit.tvm_ffi_version()
        # fork: the workers share this process's paths; nothing here has touched CUDA
        context = multiprocessing.get_context("fork")
        jobs = jobs or os.cpu_count()
        # A line when the builds start and one as each ends: a wheel build is otherwise silent
        # for minutes (pip shows it with -v).
        log(f"prebuild: building {len(missing)} modules with {jobs} jobs")
        with (
            tempfile.TemporaryDirectory() as scratch,
            ProcessPoolExecutor(jobs, mp_context=context) as pool,
        ):
            builds = {pool.submit(_build, *wanted[f], f"{scratch}/{f}"): f for f in missing}
            for done, build in enumerate(as_completed(builds), 1):
                file = builds[build]
                library, seconds = build.result()
                name, arch = wanted[file]
                log(f"prebuild: [{done}/{len(missing)}] {name} {jit.sm_name(arch)} {seconds:.0f} s")
                shutil.copyfile(library, out / file)
                entries[file] = {
                    "module": name,
                    "arch": arch,
                    "cuda": cuda,
                    "tvm_ffi": tvm_ffi,
                    "functions": exported_functions(out / file),
                }
                how[file] = f"built in {seconds:.1f} s"
    for stale in out.glob("*.so"):
        if stale.name not in wanted:
            stale.unlink()
    partial = out / f".{jit.MANIFEST}.{os.getpid()}"
    partial.write_text(json.dumps({"modules": dict(sorted(entries.items()))}, indent=1) + "\n")
    os.replace(partial, out / jit.MANIFEST)
    for file, entry in sorted(entries.items()):
        log(
            f"{entry['module']:20} {jit.sm_name(entry['arch']):8} {how[file]:16} {file:40} "
            f"{', '.join(entry['functions'])}"
        )
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dsv41_kernels.prebuild", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=jit.PREBUILT, help="default: %(default)s")
    parser.add_argument(
        "--arch",
        action="append",
        help="tvm-ffi arch string, repeatable; the folder keeps these only "
        f"(default: {' '.join(jit.PREBUILT_ARCHS)})",
    )
    parser.add_argument("--reuse", type=Path, help="a prebuilt folder to copy current modules from")
    parser.add_argument("--jobs", type=int, help="parallel builds (default: the CPU count)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        entries = prebuild(
            args.out, tuple(args.arch or jit.PREBUILT_ARCHS), reuse=args.reuse, jobs=args.jobs
        )
    except RuntimeError as e:
        print(f"prebuild: {e}", file=sys.stderr)
        return 1
    size = sum((args.out / file).stat().st_size for file in entries)
    print(
        f"prebuild: {len(entries)} modules, {size / 2**20:.1f} MiB in {args.out} "
        f"({time.perf_counter() - start:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

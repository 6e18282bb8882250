"""The CUDA modules of ``sgl-kernel/csrc``: prebuilt in the package, else built just in time.

apache-tvm-ffi is what SGLang and FlashInfer use for their own just-in-time kernels: a
small C ABI (``TVM_FFI_DLL_EXPORT_TYPED_FUNC``) taking DLPack tensor views, so torch
tensors pass straight in without a torch C++ extension build (seconds, not a minute) and
kernels launch on the stream tvm-ffi reports for the device, which is torch's current one.

A module is one ``.cu`` file, with every header beside it, built for one GPU architecture by
:func:`build_module`; :func:`module_digest` names that build (the sources, the arch, the
flags, the apache-tvm-ffi version). :func:`load_module` takes the first of:

1. the prebuilt module of that digest in the package (:data:`PREBUILT`, written when the wheel
   is built: :mod:`dsv41_kernels.prebuild`). An edited checkout has another digest, so a
   stale prebuilt module is never loaded;
2. the module of that digest in the just-in-time cache (:data:`CACHE`);
3. a just-in-time build into the cache, when nvcc and apache-tvm-ffi are present.

:func:`module_available` tells from the files alone, without loading, which of them will
serve a device, or why none will: what the admissions ask, so that an op whose module cannot
be had runs its Triton kernel or its fallback and says why.

Paths: ``DSV41_KERNELS_CSRC`` (the sources: the wheel's copy, else the checkout's),
``DSV41_KERNELS_PREBUILT`` (an empty folder forces the just-in-time path) and
``DSV41_KERNELS_CACHE``. torch is imported only where a device is asked about: the wheel build
(``setup.py``) runs this module in an environment without torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from dsv41_kernels.devices import device_arch

PACKAGE = Path(__file__).resolve().parent


def _default_csrc() -> Path:
    """The sources the wheel carries (``dsv41_kernels/csrc``), else the checkout's."""
    packaged = PACKAGE / "csrc"
    return packaged if packaged.is_dir() else PACKAGE.parents[1] / "sgl-kernel" / "csrc"


CSRC = Path(os.environ.get("DSV41_KERNELS_CSRC") or _default_csrc())
PREBUILT = Path(os.environ.get("DSV41_KERNELS_PREBUILT") or PACKAGE / "prebuilt")
CACHE = Path(os.environ.get("DSV41_KERNELS_CACHE", Path.home() / ".cache" / "dsv41-kernels"))
MANIFEST = "manifest.json"
"""The prebuilt folder's index: per file, its module, arch, CUDA and apache-tvm-ffi versions and
exported functions (:mod:`dsv41_kernels.prebuild` writes it)."""

CUDA_CFLAGS = ("-O3", "-lineinfo")
PREBUILT_ARCHS = ("9.0a", "10.0a", "10.3a")
"""The archs the wheel carries: Hopper (H100, H200, H20) and the SM100 family (B200/GB200,
B300/GB300), the GPUs the call sites admit. An ``a`` build runs on its own arch only; other
GPUs build just in time."""

PREBUILT_SOURCE, CACHED_SOURCE, BUILT_SOURCE = "prebuilt", "cached", "built now"
"""Where a loaded module came from (:func:`module_source`)."""


def sm_name(arch: str) -> str:
    """``9.0a`` -> ``sm_90a``, as nvcc and the reasons spell it."""
    return "sm_" + arch.replace(".", "")


def module_names() -> list[str]:
    """Every module: one per ``.cu`` file of :data:`CSRC`."""
    return sorted(path.stem for path in CSRC.glob("*.cu"))


def sources(name: str) -> list[Path]:
    """The ``.cu`` file of module ``name`` and every header beside it (headers change the hash)."""
    main = CSRC / f"{name}.cu"
    if not main.is_file():
        raise FileNotFoundError(
            f"no CUDA source {main} (set DSV41_KERNELS_CSRC to the csrc folder)"
        )
    return [main, *sorted(CSRC.rglob("*.cuh"))]


@functools.cache
def tvm_ffi_version() -> str | None:
    """The installed apache-tvm-ffi's version, None without it (read from its metadata)."""
    try:
        return importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:
        return None


def module_digest(name: str, arch: str) -> str:
    """The name of module ``name``'s build for ``arch``: a hash of the sources (names and
    bytes), the arch, :data:`CUDA_CFLAGS` and the apache-tvm-ffi version (its headers are
    compiled in). Prebuilt and just-in-time modules alike are found by it."""
    digest = hashlib.sha256()
    for path in sources(name):
        digest.update(path.relative_to(CSRC).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(f"{arch}\0{' '.join(CUDA_CFLAGS)}\0{tvm_ffi_version()}".encode())
    return digest.hexdigest()[:16]


def module_file(name: str, arch: str) -> str:
    """Module ``name``'s shared library for ``arch`` (:func:`module_digest` names it), in the
    prebuilt folder and in the cache alike."""
    return f"{name}-{module_digest(name, arch)}.so"


def cuda_home() -> str | None:
    """``CUDA_HOME`` (or ``CUDA_PATH``); else, for the ``nvcc`` on PATH, its toolkit, or
    ``/usr/local/cuda`` when that ``nvcc`` is a wrapper script outside it (tvm-ffi's own guess,
    nvcc's grandparent, misses it then); else None: no toolkit is looked for without an nvcc
    on PATH, the rule :func:`toolchain_available` states."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    for candidate in (Path(nvcc).resolve().parents[1], Path("/usr/local/cuda")):
        if (candidate / "bin" / "nvcc").is_file() and (candidate / "lib64").is_dir():
            return str(candidate)
    return None


NO_TOOLCHAIN = "no nvcc on PATH, CUDA_HOME and CUDA_PATH unset"


@functools.cache
def toolchain_available() -> bool:
    """Whether CUDA sources can be built here: apache-tvm-ffi, and nvcc on PATH or a toolkit
    named by CUDA_HOME / CUDA_PATH (the variables :func:`cuda_home` reads)."""
    try:
        import tvm_ffi.cpp  # noqa: F401
    except ImportError:
        return False
    return bool(shutil.which("nvcc") or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"))


@contextlib.contextmanager
def _environment(**values: str):
    """``os.environ`` with ``values`` set, restored on exit."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


def build_module(name: str, arch: str, directory: Path) -> Path:
    """Compile module ``name`` for ``arch`` in ``directory`` (a ninja build; tvm-ffi locks it
    against concurrent builders) and return the shared library: the one build that both the
    just-in-time path and the prebuilt modules come from."""
    import tvm_ffi.cpp

    directory.mkdir(parents=True, exist_ok=True)
    values = {"TVM_FFI_CUDA_ARCH_LIST": arch}  # tvm-ffi reads its target from here
    home = cuda_home()
    if home:
        values["CUDA_HOME"] = home
    with _environment(**values):
        built = tvm_ffi.cpp.build(
            name,
            sources=[str(sources(name)[0])],
            extra_cuda_cflags=list(CUDA_CFLAGS),
            extra_include_paths=[str(CSRC)],
            build_directory=str(directory),
        )
    return Path(built)


def read_manifest(folder: Path) -> dict[str, dict]:
    """A prebuilt folder's manifest entries by file name; empty when it has none."""
    try:
        return json.loads((folder / MANIFEST).read_text())["modules"]
    except FileNotFoundError:
        return {}


@functools.cache
def prebuilt_manifest() -> dict[str, dict]:
    """The package's prebuilt folder's entries (:func:`read_manifest`, read once)."""
    return read_manifest(PREBUILT)


def _torch_cuda() -> str | None:
    """The CUDA version torch was built with (its runtime is the one in the process)."""
    import torch

    return torch.version.cuda


def _major(version: str | None) -> str | None:
    return None if version is None else version.split(".")[0]


def find_prebuilt(name: str, arch: str) -> tuple[Path | None, str]:
    """The prebuilt module of ``name`` for ``arch`` that matches the sources, and a reason:
    where it is from, or why there is none (none for this arch, a stale one, another CUDA)."""
    entries = prebuilt_manifest()
    file = module_file(name, arch)
    entry = entries.get(file)
    if entry is not None and (PREBUILT / file).is_file():
        if _major(entry["cuda"]) != _major(_torch_cuda()):
            return None, f"prebuilt for CUDA {entry['cuda']}, torch runs CUDA {_torch_cuda()}"
        return PREBUILT / file, f"prebuilt for {sm_name(arch)}"
    same = [e for e in entries.values() if e["module"] == name and e["arch"] == arch]
    if not same:
        archs = sorted({sm_name(e["arch"]) for e in entries.values() if e["module"] == name})
        only = f" (only for {', '.join(archs)})" if archs else ""
        return None, f"none prebuilt for {sm_name(arch)}{only}"
    if same[0]["tvm_ffi"] != tvm_ffi_version():
        return None, (
            f"prebuilt against apache-tvm-ffi {same[0]['tvm_ffi']}, {tvm_ffi_version()} installed"
        )
    return None, "the prebuilt one is stale (sources or flags changed since)"


def cached_module(name: str, arch: str) -> Path:
    """Where the just-in-time cache keeps module ``name`` for ``arch``."""
    return CACHE / module_file(name, arch)


@dataclass(frozen=True)
class ModuleAvailability:
    """``ok``: the module can be had; ``source``: from where (:data:`PREBUILT_SOURCE`,
    :data:`CACHED_SOURCE` or :data:`BUILT_SOURCE`, None when not); ``reason``: in words."""

    ok: bool
    reason: str
    source: str | None = None

    def __bool__(self) -> bool:
        return self.ok


def find_module(name: str, arch: str) -> ModuleAvailability:
    """Where module ``name`` for ``arch`` would come from, by the load order, from files
    alone (nothing is loaded or built)."""
    if tvm_ffi_version() is None:
        return ModuleAvailability(False, "apache-tvm-ffi is not installed")
    prebuilt, why = find_prebuilt(name, arch)
    if prebuilt is not None:
        return ModuleAvailability(True, why, PREBUILT_SOURCE)
    if cached_module(name, arch).is_file():
        return ModuleAvailability(True, f"{why}; just-in-time cache", CACHED_SOURCE)
    if toolchain_available():
        return ModuleAvailability(True, f"{why}; built on first use", BUILT_SOURCE)
    return ModuleAvailability(False, f"{why}; no nvcc to build it ({NO_TOOLCHAIN})")


@functools.cache
def module_available(name: str, device_index: int) -> ModuleAvailability:
    """Whether module ``name`` can be had for CUDA device ``device_index``, from where or why
    not (:func:`find_module`; cached: admissions ask on every call). Never raises: a broken
    install (no sources, an unreadable manifest) is a reason like any other."""
    try:
        return find_module(name, device_arch(device_index))
    except (OSError, ValueError, KeyError) as e:
        return ModuleAvailability(False, f"unreadable module files: {type(e).__name__}: {e}")


_loaded_from: dict[tuple[str, int], str] = {}


def module_source(name: str, device_index: int | None = None) -> str | None:
    """Where the loaded module ``name`` of a device (default: the current one) came from;
    None before it is loaded."""
    if device_index is None:
        import torch

        device_index = torch.cuda.current_device()
    return _loaded_from.get((name, device_index))


def _publish(built: Path, cached: Path) -> None:
    """Copy a fresh build to its cache file by an atomic rename, so that a process finding
    the cache file finds it whole (a build still linking, or killed, leaves none)."""
    partial = cached.with_name(f".{cached.name}.{os.getpid()}")
    shutil.copyfile(built, partial)
    os.replace(partial, cached)


@functools.cache
def load_module(name: str, device_index: int = 0):
    """Load ``sgl-kernel/csrc/<name>.cu``'s module for CUDA device ``device_index`` in the
    load order of this module's docstring, once per process."""
    try:
        import tvm_ffi
    except ImportError as e:
        raise RuntimeError(
            "dsv41_kernels: CUDA modules are loaded with apache-tvm-ffi; "
            "pip install 'dsv41-kernels[cuda]'"
        ) from e
    arch = device_arch(device_index)
    prebuilt, why = find_prebuilt(name, arch)
    cached = cached_module(name, arch)
    failures = [why]
    for source, path in ((PREBUILT_SOURCE, prebuilt), (CACHED_SOURCE, cached)):
        if path is None or not path.is_file():
            continue
        try:
            module = tvm_ffi.load_module(str(path))
        except Exception as e:  # an unloadable file: the next source may serve
            failures.append(f"{source} {path} did not load: {e}")
            continue
        _loaded_from[name, device_index] = source
        return module
    if not toolchain_available():
        raise RuntimeError(
            f"dsv41_kernels: no CUDA module {name!r} for {sm_name(arch)} ({'; '.join(failures)}), "
            f"and building it needs nvcc ({NO_TOOLCHAIN}). Install the CUDA toolkit, a wheel "
            "with prebuilt modules, or use the torch fallback."
        )
    built = build_module(name, arch, CACHE / cached.stem)
    _publish(built, cached)
    module = tvm_ffi.load_module(str(cached))
    _loaded_from[name, device_index] = BUILT_SOURCE
    return module

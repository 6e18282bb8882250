"""The CUDA modules' load order (:mod:`dsv41_kernels.jit`) on stand-in paths: a prebuilt module
of the sources' digest, else the just-in-time cache, else a build; a stale prebuilt module, or
one for another CUDA or apache-tvm-ffi, is never loaded; what the admissions are told."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import tvm_ffi

from dsv41_kernels import admission, jit


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """jit on stand-in sources (``demo.cu`` and a header), an empty prebuilt folder and cache,
    CUDA 13.0 in torch, no toolchain, and a loader that records the paths it is handed."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "demo.cu").write_text("// the module\n")
    (csrc / "shared.cuh").write_text("// a header it shares\n")
    monkeypatch.setattr(jit, "CSRC", csrc)
    monkeypatch.setattr(jit, "PREBUILT", tmp_path / "prebuilt")
    monkeypatch.setattr(jit, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(jit, "_torch_cuda", lambda: "13.0")
    monkeypatch.setattr(jit, "toolchain_available", lambda: False)
    monkeypatch.setattr(jit, "device_arch", lambda device_index: "9.0a")
    loaded = []
    monkeypatch.setattr(tvm_ffi, "load_module", lambda path: loaded.append(Path(path)) or path)
    jit.PREBUILT.mkdir()
    jit.CACHE.mkdir()
    _clear()
    yield loaded
    _clear()


def _clear():
    for cached in (jit.prebuilt_manifest, jit.module_available, jit.load_module):
        cached.cache_clear()
    jit._loaded_from.clear()


def write_prebuilt(name="demo", arch="9.0a", **fields) -> Path:
    """A prebuilt module of the current sources (unless ``fields`` say otherwise)."""
    file = jit.module_file(name, arch)
    (jit.PREBUILT / file).write_bytes(b"a shared library")
    entry = {"module": name, "arch": arch, "cuda": "13.0", "tvm_ffi": jit.tvm_ffi_version()}
    entry.update(fields)
    manifest = jit.PREBUILT / jit.MANIFEST
    entries = json.loads(manifest.read_text())["modules"] if manifest.is_file() else {}
    manifest.write_text(json.dumps({"modules": {**entries, file: entry}}))
    jit.prebuilt_manifest.cache_clear()
    return jit.PREBUILT / file


def test_the_digest_names_sources_arch_flags_and_tvm_ffi(stand_in, monkeypatch):
    first = jit.module_digest("demo", "9.0a")
    assert jit.module_digest("demo", "9.0a") == first
    assert jit.module_digest("demo", "10.0a") != first
    (jit.CSRC / "shared.cuh").write_text("// an edited header\n")
    edited = jit.module_digest("demo", "9.0a")
    assert edited != first
    monkeypatch.setattr(jit, "CUDA_CFLAGS", ("-O2",))
    assert jit.module_digest("demo", "9.0a") != edited
    monkeypatch.setattr(jit, "tvm_ffi_version", lambda: "0.0.1")
    assert len({jit.module_digest("demo", "9.0a"), edited, first}) == 3


def test_load_order_prebuilt_then_cache_then_build(stand_in, monkeypatch):
    prebuilt = write_prebuilt()
    assert jit.find_module("demo", "9.0a") == jit.ModuleAvailability(
        True, "prebuilt for sm_90a", jit.PREBUILT_SOURCE
    )
    cached = jit.cached_module("demo", "9.0a")
    cached.write_bytes(b"a cached build")
    assert jit.load_module("demo") == str(prebuilt)
    assert jit.module_source("demo", 0) == jit.PREBUILT_SOURCE

    _clear()
    prebuilt.unlink()
    assert jit.find_module("demo", "9.0a").source == jit.CACHED_SOURCE
    assert jit.load_module("demo") == str(cached)
    assert jit.module_source("demo", 0) == jit.CACHED_SOURCE

    _clear()
    cached.unlink()
    refused = jit.find_module("demo", "9.0a")
    assert not refused and "no nvcc" in refused.reason and refused.source is None
    with pytest.raises(RuntimeError, match="nvcc"):
        jit.load_module("demo")

    builds = []

    def build(name, arch, directory):
        builds.append((name, arch, directory))
        directory.mkdir(parents=True)
        (directory / f"{name}.so").write_bytes(b"a fresh build")
        return directory / f"{name}.so"

    monkeypatch.setattr(jit, "toolchain_available", lambda: True)
    monkeypatch.setattr(jit, "build_module", build)
    assert jit.find_module("demo", "9.0a").source == jit.BUILT_SOURCE
    assert jit.load_module("demo") == str(cached)
    assert builds == [("demo", "9.0a", jit.CACHE / cached.stem)]
    assert cached.read_bytes() == b"a fresh build"
    assert jit.module_source("demo", 0) == jit.BUILT_SOURCE
    assert sorted(p.name for p in jit.CACHE.iterdir()) == [cached.stem, cached.name]


def test_a_stale_prebuilt_module_is_never_loaded(stand_in):
    stale = write_prebuilt()
    (jit.CSRC / "demo.cu").write_text("// the module, edited\n")
    found = jit.find_module("demo", "9.0a")
    assert not found and "stale" in found.reason
    with pytest.raises(RuntimeError, match="stale"):
        jit.load_module("demo")
    assert stale not in stand_in


def test_a_prebuilt_module_for_another_cuda_is_refused(stand_in):
    write_prebuilt(cuda="12.8")
    found = jit.find_module("demo", "9.0a")
    assert not found and found.reason.startswith("prebuilt for CUDA 12.8, torch runs CUDA 13.0")


def test_a_prebuilt_module_for_another_tvm_ffi_is_refused(stand_in, monkeypatch):
    built_with = jit.tvm_ffi_version()
    write_prebuilt()
    monkeypatch.setattr(jit, "tvm_ffi_version", lambda: "0.0.1")
    found = jit.find_module("demo", "9.0a")
    assert not found
    assert found.reason.startswith(f"prebuilt against apache-tvm-ffi {built_with}, 0.0.1 installed")


def test_no_prebuilt_module_for_this_arch(stand_in):
    write_prebuilt(arch="10.0a")
    found = jit.find_module("demo", "9.0a")
    assert not found and found.reason == (
        "none prebuilt for sm_90a (only for sm_100a); "
        "no nvcc to build it (no nvcc on PATH, CUDA_HOME and CUDA_PATH unset)"
    )


def test_an_unloadable_prebuilt_module_falls_through_to_the_cache(stand_in, monkeypatch):
    prebuilt = write_prebuilt()
    cached = jit.cached_module("demo", "9.0a")
    cached.write_bytes(b"a cached build")

    def load(path):
        if Path(path) == prebuilt:
            raise RuntimeError("not an ELF file")
        return path

    monkeypatch.setattr(tvm_ffi, "load_module", load)
    assert jit.load_module("demo") == str(cached)
    assert jit.module_source("demo", 0) == jit.CACHED_SOURCE


def test_a_broken_install_is_a_reason_not_an_error(stand_in):
    (jit.PREBUILT / jit.MANIFEST).write_text("{ half a manifest")
    found = jit.module_available("demo", 0)
    assert not found and found.reason.startswith("unreadable module files: JSONDecodeError")
    _clear()
    (jit.PREBUILT / jit.MANIFEST).unlink()
    found = jit.module_available("absent", 0)
    assert not found and "no CUDA source" in found.reason


def test_without_tvm_ffi_nothing_is_available(stand_in, monkeypatch):
    write_prebuilt()
    monkeypatch.setattr(jit, "tvm_ffi_version", lambda: None)
    assert jit.find_module("demo", "9.0a") == jit.ModuleAvailability(
        False, "apache-tvm-ffi is not installed"
    )


def test_the_admission_note_says_where_the_module_comes_from(monkeypatch):
    t = torch.zeros(1)
    answers = {
        "there": jit.ModuleAvailability(True, "prebuilt for sm_90a", jit.PREBUILT_SOURCE),
        "missing": jit.ModuleAvailability(False, "none prebuilt for sm_80; no nvcc"),
    }
    monkeypatch.setattr(admission, "module_available", lambda name, index: answers[name])
    assert admission.cuda_kernel_runs("there", t, True) == (True, " (there: prebuilt for sm_90a)")
    assert admission.cuda_kernel_runs("missing", t, True) == (
        False,
        " (missing: none prebuilt for sm_80; no nvcc)",
    )
    assert admission.cuda_kernel_runs("there", t, False) == (False, "")


BUILD_AND_LOAD = """
import json, sys
from dsv41_kernels import jit
jit.device_arch = lambda device_index: "9.0a"
module = jit.load_module("demo")
print(json.dumps([module.demo_answer(), jit.module_source("demo", 0)]))
"""

DEMO_SOURCE = """
#include <tvm/ffi/function.h>

int64_t demo_answer() { return 42; }

TVM_FFI_DLL_EXPORT_TYPED_FUNC(demo_answer, demo_answer);
"""


@pytest.mark.skipif(not jit.toolchain_available(), reason="no nvcc or apache-tvm-ffi")
def test_processes_building_the_same_module_at_once_share_one_build(tmp_path):
    """A cold cache and three processes starting together: tvm-ffi's lock lets one compile,
    the others find its build, and each loads a whole module (the cache file is published
    by an atomic rename)."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "demo.cu").write_text(textwrap.dedent(DEMO_SOURCE))
    env = dict(
        os.environ,
        DSV41_KERNELS_CSRC=str(csrc),
        DSV41_KERNELS_CACHE=str(tmp_path / "cache"),
        DSV41_KERNELS_PREBUILT=str(tmp_path / "prebuilt"),
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_AND_LOAD], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    results = [json.loads(p.communicate(timeout=300)[0]) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0]
    assert results == [[42, jit.BUILT_SOURCE]] * 3
    cache = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(cache) == 2 and cache[1] == cache[0] + ".so"  # the build and its module, no part


def test_toolchain_and_cuda_home_follow_one_rule(monkeypatch, tmp_path):
    """No nvcc on PATH and neither variable set: no toolkit is guessed (a serving image); a
    toolkit named by CUDA_PATH alone both builds and is used."""
    pytest.importorskip("tvm_ffi.cpp")
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(jit.shutil, "which", lambda name: None)
    jit.toolchain_available.cache_clear()
    try:
        assert jit.cuda_home() is None and not jit.toolchain_available()
        monkeypatch.setenv("CUDA_PATH", str(tmp_path))
        jit.toolchain_available.cache_clear()
        assert jit.cuda_home() == str(tmp_path) and jit.toolchain_available()
    finally:
        jit.toolchain_available.cache_clear()

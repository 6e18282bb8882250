"""Every CUDA source compiles for every arch the wheel carries (sm_90a, sm_100a, sm_103a), GPU
or not: the prebuild step's outputs (``python -m dsv41_kernels.prebuild``, which ``.ci/run``
runs first; built here when missing), each exporting the functions its source declares."""

import re
from pathlib import Path

import pytest

from dsv41_kernels.jit import CSRC, PREBUILT, PREBUILT_ARCHS, module_file
from dsv41_kernels.prebuild import exported_functions

SOURCES = sorted(CSRC.glob("*.cu"))


def declared_functions(source: Path) -> list[str]:
    return sorted(re.findall(r"TVM_FFI_DLL_EXPORT_TYPED_FUNC\((\w+),", source.read_text()))


@pytest.mark.parametrize("arch", PREBUILT_ARCHS)
@pytest.mark.parametrize("source", SOURCES, ids=[s.name for s in SOURCES])
def test_compiles(source: Path, arch: str, prebuilt_modules):
    file = module_file(source.stem, arch)
    entry = prebuilt_modules[file]
    assert (entry["module"], entry["arch"]) == (source.stem, arch)
    assert entry["functions"] == declared_functions(source) != []
    assert exported_functions(PREBUILT / file) == entry["functions"]


def test_sources_exist():
    assert SOURCES, f"no CUDA sources under {CSRC}"


def test_only_current_modules_are_kept(prebuilt_modules):
    assert len(prebuilt_modules) == len(SOURCES) * len(PREBUILT_ARCHS)
    assert sorted(p.name for p in PREBUILT.glob("*.so")) == sorted(prebuilt_modules)

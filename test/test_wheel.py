"""The wheel, built from the checkout as the README says (its prebuild reuses the current
prebuilt folder): it holds the CUDA sources and every prebuilt module under a platform tag the
modules honour, and, installed into a bare folder on a machine without nvcc, it loads every
module prebuilt, in several processes at once, building nothing."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dsv41_kernels import jit
from dsv41_kernels.calibration import drivers

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "python" / "dsv41_kernels" / "sglang_plugin" / "policies"
CALIBRATION = ROOT / "python" / "dsv41_kernels" / "calibration"
MANYLINUX_2_28 = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11)}
"""The newest symbol versions a manylinux_2_28 library may need (glibc 2.28, gcc 8's libstdc++)."""


@pytest.fixture(scope="module")
def wheel(prebuilt_modules, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check"]
        + ["--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        env=dict(os.environ, DSV41_KERNELS_PREBUILD="1"),
    )
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_holds_the_sources_and_every_prebuilt_module(wheel, prebuilt_modules):
    assert wheel.name.endswith(f"-py3-none-manylinux_2_28_{platform.machine()}.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"dsv41_kernels/csrc/{p.relative_to(jit.CSRC)}" for p in jit.CSRC.rglob("*.cu*")}
    modules = {f"dsv41_kernels/prebuilt/{file}" for file in prebuilt_modules}
    assert sources <= names and modules <= names
    policies = {f"dsv41_kernels/sglang_plugin/policies/{p.name}" for p in POLICIES.glob("*.json")}
    assert policies and policies <= names  # the SGLang plugin's built-in policies
    calibration = {f"dsv41_kernels/calibration/{p.name}" for p in CALIBRATION.glob("*.py")}
    assert "dsv41_kernels/calibration/drivers.py" in calibration  # calibrate's call-site drivers
    assert calibration <= names
    assert f"dsv41_kernels/prebuilt/{jit.MANIFEST}" in names
    assert {n for n in names if n.startswith("dsv41_kernels/prebuilt/")} - modules == {
        f"dsv41_kernels/prebuilt/{jit.MANIFEST}"
    }


def test_the_wheel_carries_the_license(wheel):
    archive = zipfile.ZipFile(wheel)
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    assert "License-File: LICENSE" in archive.read(metadata).decode()
    assert any(n.endswith("/licenses/LICENSE") for n in archive.namelist())


def test_the_modules_need_no_newer_libraries_than_the_tag(prebuilt_modules):
    for file in prebuilt_modules:
        listing = subprocess.run(
            ["objdump", "-T", str(jit.PREBUILT / file)], capture_output=True, text=True, check=True
        ).stdout
        for library, version in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI)_([\d.]+)\b", listing):
            needed = tuple(int(v) for v in version.split("."))
            assert needed <= MANYLINUX_2_28[library], f"{file} needs {library}_{version}"


LOAD_EVERY_MODULE = """
import json, sys
from dsv41_kernels import jit
archs = dict(enumerate(jit.PREBUILT_ARCHS))
jit.device_arch = archs.__getitem__  # stand-in devices, one per arch
jit._torch_cuda = lambda: "13.0"  # the CUDA runtime of the GPU machine's torch
loaded = []
for entry in jit.prebuilt_manifest().values():
    index = jit.PREBUILT_ARCHS.index(entry["arch"])
    module = jit.load_module(entry["module"], index)
    for function in entry["functions"]:
        getattr(module, function)  # resolves, or raises
    loaded.append([entry["module"], entry["arch"], jit.module_source(entry["module"], index)])
print(json.dumps({"package": jit.__file__, "loaded": sorted(loaded)}))
"""


def install(wheel: Path, target: Path) -> Path:
    """``wheel`` installed into the bare folder ``target``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        + ["--target", str(target), str(wheel)],
        check=True,
    )
    return target


LIST_CALIBRATION_CASES = """
import json, sys
from dsv41_kernels import calibrate_cli
from dsv41_kernels.calibration import drivers
cases = {site: len(driver.cases("cpu")) for site, driver in drivers.SITES.items()}
print(json.dumps({"package": drivers.__file__, "cases": cases, "sglang": "sglang" in sys.modules}))
"""


def test_the_installed_wheel_has_calibrates_drivers(wheel, tmp_path):
    """``dsv41-kernels calibrate`` needs no checkout: the installed package alone, outside one,
    lists every call site's cases without importing SGLang."""
    target = install(wheel, tmp_path / "target")
    done = subprocess.run(
        [sys.executable, "-c", LIST_CALIBRATION_CASES],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert Path(result["package"]).is_relative_to(target)
    assert not result["sglang"]
    assert result["cases"] == {site: len(d.cases("cpu")) for site, d in drivers.SITES.items()}


def test_the_installed_wheel_loads_every_module_prebuilt_without_nvcc(wheel, tmp_path):
    target = install(wheel, tmp_path / "target")
    path = [d for d in os.environ["PATH"].split(os.pathsep) if not Path(d, "nvcc").exists()]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(
        PATH=os.pathsep.join(path),
        PYTHONPATH=str(target),
        DSV41_KERNELS_CACHE=str(tmp_path / "cache"),
    )
    env.pop("DSV41_KERNELS_CSRC", None)
    env.pop("DSV41_KERNELS_PREBUILT", None)
    assert shutil.which("nvcc", path=env["PATH"]) is None
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD_EVERY_MODULE],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0]
    expected = sorted(
        [name, arch, jit.PREBUILT_SOURCE]
        for name in jit.module_names()
        for arch in jit.PREBUILT_ARCHS
    )
    for result in results:
        assert Path(result["package"]).is_relative_to(target)
        assert result["loaded"] == expected
    assert not (tmp_path / "cache").exists()  # nothing was built

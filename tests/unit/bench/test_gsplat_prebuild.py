"""bench/gsplat_prebuild.py: gsplat's kernels compiled here for the device and carried as
.kernels/. CI compiles no CUDA: it checks what the folder is compared with (the pins, the
flags, the carried gsplat wheel), how the toolkit is derived from torch's metadata, and that
the device's link puts gsplat.csrc where gsplat's loader takes it before any JIT build.
bench/gpu_device.sh's use of it (the dry run refusing a stale folder, the plan) is
tests/unit/bench/test_gpu_device.py's."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

from bench import gpu_imports
from bench import gsplat_kernels as gk
from bench import gsplat_prebuild as gp
from tests import components
from tests.components import skip_without

ROOT = Path(__file__).resolve().parents[3]


def write_kernels(folder: Path, wheels: Path | None = None, objects=("A.cuda.o", "B.o"), **fields):
    """A kernels folder as ``build`` writes it for the pins, its objects a few bytes each; the
    gsplat wheel in ``wheels`` (if any) is the one it was built from; ``fields`` override the
    manifest's."""
    (folder / "objects").mkdir(parents=True, exist_ok=True)
    entries = {}
    for name in objects:
        data = f"object {name}".encode()
        (folder / "objects" / name).write_bytes(data)
        source = "csrc/" + name.replace(".cuda.o", ".cu").replace(".o", ".cpp")
        entries[name] = {
            "source": source,
            "source_sha256": "?",
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    gsplat = next(Path(wheels).glob("gsplat-*.whl")) if wheels else None
    manifest = {
        "format": gk.FORMAT,
        **gk.pins(),
        "torch_build": gk.pins()["torch"] + "+cu130",
        "cuda": "13.0",
        "flags": gk.flags(),
        "toolkit": {"nvidia-cuda-nvcc": "13.0.88"},
        "wheels": {"gsplat": {"file": gsplat.name, "sha256": gk.sha256(gsplat)}} if gsplat else {},
        "objects": entries,
        **fields,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def check(folder, wheels=None, capsys=None):
    argv = ["check", str(folder)] + (["--wheels", str(wheels)] if wheels else [])
    rc = gp.main(argv)
    return rc, capsys.readouterr() if capsys else None


def test_a_folder_built_for_the_pins_passes_and_each_stale_part_is_named(tmp_path, capsys):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "gsplat-1.5.3-py3-none-any.whl").write_bytes(b"the wheel compiled from")
    folder = tmp_path / "kernels"
    write_kernels(folder, wheels)
    rc, out = check(folder, wheels, capsys)
    assert rc == 0 and "2 objects for sm_90" in out.out and "torch 2.11.0+cu130" in out.out

    def refused(expect):
        rc, out = check(folder, wheels, capsys)
        assert rc == 1 and expect in out.err, out.err
        assert "rebuild: python bench/gsplat_prebuild.py build" in out.err

    for field, value, expect in [
        ("gsplat", "1.5.2", "gsplat: built for '1.5.2', the pins say '1.5.3'"),
        ("arch", "sm_80", "arch: built for 'sm_80', the pins say 'sm_90'"),
        ("python", "3.11", "python: built for '3.11'"),
        ("torch", "2.10.0", "torch: built for '2.10.0', the pins say '2.11.0'"),
        ("torch_build", "2.11.0+cpu", "is not a CUDA build of the pinned torch"),
        ("flags", {**gk.flags(), "cuda": ["-O0"]}, "flags: built for"),
    ]:
        write_kernels(folder, wheels, **{field: value})
        refused(expect)
    write_kernels(folder, wheels)
    (folder / "objects" / "B.o").write_bytes(b"another build")
    refused("objects/B.o: not the object the manifest names (sha256)")
    (folder / "objects" / "B.o").unlink()
    refused("objects/B.o: missing")
    write_kernels(folder, wheels)
    (folder / "objects" / "C.o").write_bytes(b"left over")
    refused("objects/C.o: not in the manifest")
    (folder / "objects" / "C.o").unlink()
    (wheels / "gsplat-1.5.3-py3-none-any.whl").write_bytes(b"a rebuilt wheel")
    refused("gsplat-1.5.3-py3-none-any.whl: not the wheel the kernels were compiled from")


def test_a_missing_or_unreadable_folder_is_one_line(tmp_path, capsys):
    rc, out = check(tmp_path / "none", capsys=capsys)
    assert rc == 1 and out.err.count("\n") == 1
    assert "no manifest.json (build it: python bench/gsplat_prebuild.py build)" in out.err
    (tmp_path / "manifest.json").write_text("{not json")
    rc, out = check(tmp_path, capsys=capsys)
    assert rc == 1 and out.err.count("\n") == 1 and "manifest.json: not a manifest" in out.err


def test_a_pin_moved_on_makes_the_carried_kernels_stale(tmp_path, monkeypatch, capsys):
    """The pins are read from the lists the device runs with, when the check runs: bumping
    gsplat in gpu_wheels.txt (or torch on the image) refuses the kernels built before."""
    folder = tmp_path / "kernels"
    write_kernels(folder)
    assert check(folder, capsys=capsys)[0] == 0
    bumped = tmp_path / "gpu_wheels.txt"
    bumped.write_text(gpu_imports.WHEELS.read_text().replace("gsplat==1.5.3", "gsplat==1.5.4"))
    monkeypatch.setattr(gpu_imports, "WHEELS", bumped)
    rc, out = check(folder, capsys=capsys)
    assert rc == 1 and "gsplat: built for '1.5.3', the pins say '1.5.4'" in out.err
    image = tmp_path / "gpu_image_packages.txt"
    image.write_text(
        gpu_imports.IMAGE_PACKAGES.read_text().replace("torch==2.11.0", "torch==2.12.0")
    )
    monkeypatch.setattr(gpu_imports, "IMAGE_PACKAGES", image)
    rc, out = check(folder, capsys=capsys)
    assert "torch: built for '2.11.0', the pins say '2.12.0'" in out.err


TORCH_METADATA = textwrap.dedent(
    """\
    Name: torch
    Requires-Dist: filelock
    Requires-Dist: cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"
    Requires-Dist: triton==3.6.0; platform_system == "Linux"
    """
)
_ON = "(sys_platform == 'linux' or sys_platform == 'win32') and extra =="
TOOLKIT_METADATA = "Name: cuda-toolkit\nRequires-Dist: cuda-pathfinder~=1.1\n" + "".join(
    f"Requires-Dist: {name}=={version}.*; {_ON} '{extra}'\n"
    for name, version, extra in [
        ("nvidia-cublas", "13.1.0.3", "all"),
        ("nvidia-cuda-nvcc", "13.0.88", "all"),
        ("nvidia-cuda-cccl", "13.0.85", "cccl"),
        ("nvidia-cuda-crt", "13.0.88", "crt"),
        ("nvidia-cublas", "13.1.0.3", "cublas"),
        ("nvidia-cuda-runtime", "13.0.96", "cudart"),
        ("nvidia-cuda-nvcc", "13.0.88", "nvcc"),
        ("nvidia-nvvm", "13.0.88", "nvvm"),
    ]
)  # the lines of torch 2.11.0's and cuda-toolkit 13.0.2's METADATA that matter, as on PyPI


def test_the_toolkit_is_the_one_torchs_wheel_requires():
    assert gp.cuda_toolkit_pin(TORCH_METADATA) == "13.0.2"
    assert gp.toolkit_parts(TOOLKIT_METADATA) == {
        "nvidia-cuda-cccl": "13.0.85",
        "nvidia-cuda-crt": "13.0.88",
        "nvidia-cuda-runtime": "13.0.96",
        "nvidia-cuda-nvcc": "13.0.88",
        "nvidia-nvvm": "13.0.88",
    }  # cublas is torch's, not the compiler's; 'all' and the unconditional line are not parts
    with pytest.raises(gk.PrebuildError, match="requires no cuda-toolkit on Linux"):
        gp.cuda_toolkit_pin(TORCH_METADATA.replace("cuda-toolkit", "cuda-bindings"))
    no_nvvm = "\n".join(line for line in TOOLKIT_METADATA.splitlines() if "'nvvm'" not in line)
    with pytest.raises(gk.PrebuildError, match=r"no requirement for extra \['nvvm'\]"):
        gp.toolkit_parts(no_nvvm)


def test_the_flags_are_torchs_and_gsplats():
    """What torch's JIT build and gsplat's _backend would pass (the installed gsplat is the
    pinned version; torch here is another version, whose CUDA flags the build also compares
    with the pinned torch's cpp_extension.py)."""
    import gsplat
    from torch.utils import cpp_extension

    backend = (Path(gsplat.__file__).parent / "cuda" / "_backend.py").read_text()
    assert gsplat.__version__ == gk.pins()["gsplat"]
    for flag in gk.GSPLAT_CUDA_FLAGS + gk.GSPLAT_CXX_FLAGS:
        assert f'"{flag}"' in backend or f"'{flag}'" in backend, flag
    assert "-O3" in backend and 'opt_level = "-O0" if FAST_COMPILE else "-O3"' in backend
    assert list(gk.NVCC_FLAGS[:5]) == cpp_extension.COMMON_NVCC_FLAGS
    assert (
        gp.torch_flags(Path(cpp_extension.__file__).read_text()) == cpp_extension.COMMON_NVCC_FLAGS
    )
    os.environ["TORCH_CUDA_ARCH_LIST"], saved = "9.0", os.environ.get("TORCH_CUDA_ARCH_LIST")
    try:
        assert cpp_extension._get_cuda_arch_flags() == [gk.NVCC_FLAGS[5]]
    finally:
        os.environ.pop("TORCH_CUDA_ARCH_LIST") if saved is None else os.environ.update(
            TORCH_CUDA_ARCH_LIST=saved
        )
    # the 28 objects are what gsplat's _backend globs, ext.cpp aside
    objects = gk.sources(Path(gsplat.__file__).parent / "cuda")
    assert len(objects) == 28 and "ext.cpp" not in " ".join(objects.values())
    assert objects["RasterizeToPixels3DGSFwd.cuda.o"] == "csrc/RasterizeToPixels3DGSFwd.cu"


@pytest.fixture
def site(tmp_path):
    """gsplat installed in a folder of its own (a copy of this one), as on the device."""
    import gsplat

    site = tmp_path / "site"
    shutil.copytree(
        Path(gsplat.__file__).parent, site / "gsplat", ignore=shutil.ignore_patterns("__pycache__")
    )
    return site


def kernels_for_here(folder: Path, site: Path) -> dict:
    """A kernels folder whose manifest matches this process (its torch, Python, gsplat)."""
    cuda = site / "gsplat" / "cuda"
    manifest = write_kernels(
        folder,
        torch_build=torch.__version__,
        python="{}.{}".format(*sys.version_info[:2]),
        cuda=torch.version.cuda,
        ext_sha256=gk.sha256(cuda / "ext.cpp"),
    )
    for entry in manifest["objects"].values():
        entry["source"] = "csrc/Null.cpp"
        entry["source_sha256"] = gk.sha256(cuda / "csrc/Null.cpp")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


C_MODULE = """
#include <Python.h>
static PyObject *null(PyObject *self, PyObject *args) { Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"null", null, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "csrc", NULL, -1, methods};
PyMODINIT_FUNC PyInit_csrc(void) { return PyModule_Create(&mod); }
"""


@skip_without(components.CXX, shutil.which("cc"), "a stand-in extension is compiled")
def test_link_puts_gsplat_csrc_where_gsplats_loader_takes_it_before_a_build(tmp_path, site):
    """The device's link (torch's load stood in by a C module named as gsplat's) leaves
    ``gsplat/csrc<suffix>``; chord's load_kernels then gets it from gsplat's own loader with no
    JIT build (a build here, with no nvcc, would give None)."""
    folder = tmp_path / "kernels"
    manifest = kernels_for_here(folder, site)
    calls = {}

    def loader(**kwargs):  # what torch.utils.cpp_extension.load builds: a module named csrc
        calls.update(kwargs)
        build = Path(kwargs["build_directory"])
        src = build / "csrc.c"
        src.write_text(C_MODULE)
        out = build / f"csrc{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        inc = sysconfig.get_path("include")
        subprocess.run(["cc", "-shared", "-fPIC", f"-I{inc}", str(src), "-o", str(out)], check=True)
        spec = importlib.util.spec_from_file_location("csrc", out)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    target = gk.link(folder, site, loader=loader)
    assert target == site / "gsplat" / f"csrc{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    assert calls["name"] == "csrc" and calls["with_cuda"] is True
    assert calls["sources"] == [str(site / "gsplat" / "cuda" / "ext.cpp")]
    assert calls["extra_ldflags"] == [
        str((folder / "objects" / o).resolve()) for o in manifest["objects"]
    ]
    probe = textwrap.dedent(
        """
        import json, os, sys
        from chord.render import gsplat_backend as gb
        kernels = gb.load_kernels((9, 0))
        print(json.dumps({"file": gb.kernels_file(), "null": kernels.null() is None,
                          "built": os.path.exists(gb.extensions_dir((9, 0)) / gb.EXTENSION)}))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "file": str(target),
        "null": True,
        "built": False,
    }


def test_link_refuses_kernels_for_another_torch_or_gsplat_and_installs_nothing(
    tmp_path, site, capsys
):
    folder = tmp_path / "kernels"
    kernels_for_here(folder, site)
    never = lambda **kw: pytest.fail("linked kernels that do not match")  # noqa: E731
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "torch_build": "2.11.0+cu130"}))
    expect = f"torch_build: built for '2.11.0+cu130', this is '{torch.__version__}'"
    with pytest.raises(gk.PrebuildError, match=re.escape(expect)):
        gk.link(folder, site, loader=never)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with open(site / "gsplat" / "cuda" / "csrc" / "Null.cpp", "a") as f:
        f.write("// another gsplat\n")
    with pytest.raises(gk.PrebuildError, match="csrc/Null.cpp: not the installed gsplat's source"):
        gk.link(folder, site, loader=never)
    assert gp.main(["link", str(folder), "--site", str(site)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gsplat_prebuild.py link: ") and err.count("\n") == 1
    assert not list((site / "gsplat").glob("csrc*"))

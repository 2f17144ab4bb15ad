"""The carried folder of gsplat's prebuilt kernels (``.kernels/``, written by
bench/gsplat_prebuild.py here): what they are built for (:func:`pins`, :func:`flags`), whether a
folder is current (:func:`problems`, the dry run's check), and the device's side
(:func:`link`): ext.cpp compiled against the device's own Python and torch by torch's
``cpp_extension.load``, the carried objects linked in, the module put into the installed gsplat
as ``gsplat.csrc``, which gsplat's ``_backend`` imports before it tries a JIT build
(chord.render.gsplat_backend). :func:`link` refuses objects built for another torch, Python,
CUDA, card or gsplat source.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: bench/ is not a package on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import gpu_imports  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: the device's cards: H100 and H200 are both compute capability 9.0 (device notes, KINDS.md)
CAPABILITY = (9, 0)
ARCH = "sm_{}{}".format(*CAPABILITY)
#: manifest layout; bump when the meaning of a field changes
FORMAT = 1
MODULE = "csrc"  # gsplat's prebuilt module, ``gsplat.csrc``
#: torch's cpp_extension (2.11: COMMON_NVCC_FLAGS, _get_cuda_arch_flags, common_cflags) and
#: gsplat 1.5.3's _backend (-O3, -use_fast_math, -Wno-attributes); the test compares the
#: latter with the installed gsplat's source
COMMON_FLAGS = (f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H")
NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_{0}{1},code=sm_{0}{1}".format(*CAPABILITY),
    "--compiler-options",
    "-fPIC",
)
GSPLAT_CUDA_FLAGS = ("-O3", "-use_fast_math")
GSPLAT_CXX_FLAGS = ("-O3", "-Wno-attributes")
STD = "-std=c++17"


class PrebuildError(Exception):
    """A one-line reason the kernels cannot be built, checked or linked."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pins() -> dict[str, str]:
    """What the kernels are built for: gsplat as carried (gpu_wheels.txt), torch as on the
    device's image (gpu_image_packages.txt), the device's Python and card."""
    torch = gpu_imports.image_packages(gpu_imports.IMAGE_PACKAGES).get("torch")
    if not torch:
        raise PrebuildError(f"{gpu_imports.IMAGE_PACKAGES.name}: no torch==VERSION line")
    return {
        "gsplat": gpu_imports.carried_wheels(gpu_imports.WHEELS)["gsplat"],
        "torch": torch,
        "python": gpu_imports.DEVICE_MARKERS["python_version"],
        "arch": ARCH,
    }


def flags() -> dict[str, list[str]]:
    """The compile flags, include paths aside (they differ between machines)."""
    cxx = [*COMMON_FLAGS, "-fPIC", STD, *GSPLAT_CXX_FLAGS]
    return {"cuda": [*COMMON_FLAGS, *NVCC_FLAGS, *GSPLAT_CUDA_FLAGS, STD], "cxx": cxx}


def sources(gsplat_cuda: Path) -> dict[str, str]:
    """``{object name: source relative to gsplat/cuda}`` of the 28 objects, as gsplat's
    _backend globs them (``csrc/*.cu``, ``csrc/*.cpp``), ext.cpp left to the device."""
    out = {}
    for src in sorted(gsplat_cuda.glob("csrc/*.cu")) + sorted(gsplat_cuda.glob("csrc/*.cpp")):
        out[src.stem + (".cuda.o" if src.suffix == ".cu" else ".o")] = f"csrc/{src.name}"
    return out


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise PrebuildError(
            f"{folder}: no manifest.json (build it: python bench/gsplat_prebuild.py build)"
        ) from None
    except (OSError, ValueError) as exc:
        raise PrebuildError(f"{path}: not a manifest ({exc})") from None
    found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
    if found != FORMAT:
        raise PrebuildError(f"{path}: format {found!r}, expected {FORMAT}")
    return manifest


def object_problems(folder: Path, manifest: dict) -> list[str]:
    """Objects missing, changed (sha256) or not in the manifest."""
    problems = []
    objects = manifest.get("objects") or {}
    present = {p.name for p in (Path(folder) / "objects").glob("*")}
    for name, entry in objects.items():
        path = Path(folder) / "objects" / name
        if name not in present:
            problems.append(f"objects/{name}: missing")
        elif sha256(path) != entry.get("sha256"):
            problems.append(f"objects/{name}: not the object the manifest names (sha256)")
    problems += [f"objects/{n}: not in the manifest" for n in sorted(present - set(objects))]
    return problems


def problems(folder: Path, wheels: Path | None = None) -> list[str]:
    """What keeps ``folder`` from being the kernels for the device as pinned: the manifest's
    gsplat, torch, Python, arch or flags not this repository's, an object missing or changed,
    the gsplat wheel in ``wheels`` (.whl/) not the one they were compiled from."""
    manifest = read_manifest(folder)
    out = []
    for key, want in {**pins(), "flags": flags()}.items():
        if manifest.get(key) != want:
            out.append(f"{key}: built for {manifest.get(key)!r}, the pins say {want!r}")
    if not str(manifest.get("torch_build", "")).startswith(pins()["torch"] + "+cu"):
        out.append(
            f"torch_build: {manifest.get('torch_build')!r} is not a CUDA build of the pinned torch"
        )
    out += object_problems(folder, manifest)
    gsplat = next(Path(wheels).glob("gsplat-*.whl"), None) if wheels else None
    built_from = (manifest.get("wheels") or {}).get("gsplat", {})
    if gsplat is not None and sha256(gsplat) != built_from.get("sha256"):
        out.append(
            f"{gsplat.name}: not the wheel the kernels were compiled from "
            f"({built_from.get('file')})"
        )
    return out


def runtime_problems(manifest: dict, gsplat_cuda: Path) -> list[str]:
    """What keeps the objects from linking into this process's torch, Python and gsplat."""
    import torch

    out = []
    here = {"torch_build": torch.__version__, "python": "{}.{}".format(*sys.version_info[:2])}
    for key, value in here.items():
        if manifest.get(key) != value:
            out.append(f"{key}: built for {manifest.get(key)!r}, this is {value!r}")
    if torch.version.cuda != manifest.get("cuda"):
        out.append(f"cuda: built with {manifest.get('cuda')}, torch's is {torch.version.cuda}")
    if torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) != CAPABILITY:
        out.append(f"arch: built for {ARCH}, the card is {torch.cuda.get_device_capability()}")
    for name, entry in manifest.get("objects", {}).items():
        src = gsplat_cuda / entry["source"]
        if not src.exists() or sha256(src) != entry["source_sha256"]:
            out.append(f"{entry['source']}: not the installed gsplat's source of {name}")
    ext = gsplat_cuda / "ext.cpp"
    if not ext.exists() or sha256(ext) != manifest.get("ext_sha256"):
        out.append(f"{ext}: not the ext.cpp the objects were built beside")
    return out


def link(folder: Path, site: Path, loader=None) -> Path:
    """gsplat's ``csrc`` module in ``site``'s gsplat: ext.cpp compiled by torch's
    ``cpp_extension.load`` against this Python and torch, the carried objects linked in
    (``loader``: tests pass a stand-in). PrebuildError when they do not match; the module is
    put in place only once it has loaded."""
    manifest = read_manifest(folder)
    gsplat_cuda = Path(site) / "gsplat" / "cuda"
    bad = object_problems(folder, manifest) + runtime_problems(manifest, gsplat_cuda)
    if bad:
        raise PrebuildError(f"{folder}: " + "; ".join(bad))
    if loader is None:
        from torch.utils.cpp_extension import load as loader
    build_dir = Path(tempfile.mkdtemp(prefix="gsplat-link-"))
    module = loader(
        name=MODULE,
        sources=[str(gsplat_cuda / "ext.cpp")],
        extra_cflags=list(GSPLAT_CXX_FLAGS),
        extra_ldflags=[str(Path(folder, "objects", o).resolve()) for o in manifest["objects"]],
        extra_include_paths=[
            str(gsplat_cuda / "include"),
            str(gsplat_cuda / "csrc/third_party/glm"),
        ],
        build_directory=str(build_dir),
        with_cuda=True,
        verbose=True,
    )
    if not hasattr(module, "null"):  # ext.cpp's first binding: the objects' functions are there
        raise PrebuildError(f"{module.__file__}: gsplat's bindings are missing")
    target = gsplat_cuda.parent / f"{MODULE}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    shutil.copy2(module.__file__, target)
    return target

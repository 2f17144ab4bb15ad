"""gsplat's CUDA kernels for the GPU device machine (H100/H200: sm_90), compiled here on a CPU
machine and carried as ``.kernels/`` beside the wheels (``.whl/``), so no device second goes to
nvcc.

gsplat 1.5.3 has 29 translation units: 28 kernels and their C++ launchers (``csrc/*.cu``,
``csrc/*.cpp``), which include ATen and CUDA headers only, and ``ext.cpp``, its pybind11 module,
which includes ``torch/extension.h`` and so ``Python.h``. The 28 are compiled here against the
device's torch headers (the torch wheel of bench/gpu_image_packages.txt's version, from PyPI)
with the CUDA toolkit that wheel requires (its ``cuda-toolkit`` pin's nvcc, crt, nvvm, cccl and
cudart wheels, from PyPI; nvcc needs no GPU), with the flags torch's JIT build and gsplat's
``_backend`` give them, and nothing on the include path holds ``Python.h``. ext.cpp is not:
no registry this machine reaches serves CPython 3.12's headers (Debian 12 has 3.11, PyPI none,
and npm's portable Python fetches its build at install), and another minor version's headers
are another ABI. So the device compiles that one file against its own Python and torch and links
the 28 objects in (:func:`link`: torch's own ``cpp_extension.load`` with one source and the
objects as link inputs), into gsplat's package as ``gsplat.csrc``: the prebuilt module
gsplat's ``_backend`` imports before it tries a JIT build (chord.render.gsplat_backend).

    python bench/gsplat_prebuild.py build [--cache DIR] [--out .kernels] [--jobs N]   # here
    python bench/gsplat_prebuild.py check [FOLDER] [--wheels .whl]  # here: FOLDER is current
    python bench/gsplat_prebuild.py link [FOLDER] --site /tmp/site  # there: gsplat.csrc

``build`` downloads into ``--cache`` (about 0.6 GB: torch's wheel is most of it; never the
repository) and writes FOLDER whole or not at all: ``manifest.json`` (versions, flags, sha256
of every input wheel, source and object) and ``objects/``. ``check`` (bench/gpu_device.sh's
dry run) refuses a folder built for other pins, flags or gsplat wheel; ``link`` refuses one that
does not match the running torch, Python and installed gsplat (the device then JIT-builds).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import datetime as dt
import hashlib
import importlib.machinery
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

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
#: the toolkit parts nvcc needs, as extras of torch's ``cuda-toolkit`` pin
TOOLKIT_EXTRAS = ("nvcc", "crt", "nvvm", "cccl", "cudart")
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
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")  # fmt: skip


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


def torch_flags(cpp_extension_source: str) -> list[str]:
    """``COMMON_NVCC_FLAGS`` of a torch's ``torch/utils/cpp_extension.py``, read, not run."""
    for node in ast.parse(cpp_extension_source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMMON_NVCC_FLAGS":
            return ast.literal_eval(node.value)
    raise PrebuildError("torch's cpp_extension.py has no COMMON_NVCC_FLAGS")


def requirements(metadata: str) -> list[Requirement]:
    return [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines()
            if line.startswith("Requires-Dist:")]  # fmt: skip


def cuda_toolkit_pin(torch_metadata: str) -> str:
    """The version of ``cuda-toolkit`` that a torch wheel's METADATA requires on the device."""
    env = dict(gpu_imports.DEVICE_MARKERS)
    for req in requirements(torch_metadata):
        if req.name == "cuda-toolkit" and (req.marker is None or req.marker.evaluate(env)):
            return exact(req)
    raise PrebuildError("torch's METADATA requires no cuda-toolkit on Linux: not a CUDA build")


def toolkit_parts(toolkit_metadata: str) -> dict[str, str]:
    """``{distribution: version}`` of the parts nvcc needs: the requirements of the
    ``cuda-toolkit`` metapackage under its extras :data:`TOOLKIT_EXTRAS` (``extra == 'nvcc'``
    and so on, not its ``all``), at the device's markers."""
    env = dict(gpu_imports.DEVICE_MARKERS)
    out, found = {}, set()
    for req in requirements(toolkit_metadata):
        if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            continue  # needed without an extra: not one of the parts
        for extra in TOOLKIT_EXTRAS:
            if req.marker.evaluate({**env, "extra": extra}):
                out[req.name] = exact(req).removesuffix(".*")
                found.add(extra)
    missing = [e for e in TOOLKIT_EXTRAS if e not in found]
    if missing:
        raise PrebuildError(f"cuda-toolkit's METADATA has no requirement for extra {missing}")
    return out


def exact(req: Requirement) -> str:
    spec = list(req.specifier)
    if len(spec) != 1 or spec[0].operator != "==":
        raise PrebuildError(f"{req}: expected NAME==VERSION")
    return spec[0].version


def download(cache: Path, *requirements: str) -> list[Path]:
    """The wheels of ``requirements`` (``NAME==VERSION``) for the device's platform, in
    ``cache/wheels`` (pip keeps a file already there)."""
    folder = cache / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", pins()["python"], "--implementation", "cp", "-d", str(folder)]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *requirements], check=True, stdout=subprocess.DEVNULL)
    found = []
    for req in requirements:
        name, version = req.split("==")
        wheel = next(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"), None)
        if wheel is None:
            raise PrebuildError(f"pip left no wheel of {req} in {folder}")
        found.append(wheel)
    return found


def unpack(wheel: Path, into: Path, pattern: str) -> Path:
    """The members of ``wheel`` matching the regex ``pattern`` under ``into`` (once)."""
    done = into / f".{wheel.name}-{hashlib.sha256(pattern.encode()).hexdigest()[:8]}.unpacked"
    if not done.exists():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(into, [n for n in z.namelist() if re.match(pattern, n)])
        done.touch()
    return into


def toolchain(cache: Path) -> dict:
    """Download and unpack torch's headers, the toolkit and gsplat's sources: the paths, the
    versions and the wheels' sha256."""
    p = pins()
    (torch_wheel,) = download(cache, f"torch=={p['torch']}")
    with zipfile.ZipFile(torch_wheel) as z:
        meta = z.read(f"torch-{p['torch']}.dist-info/METADATA").decode()
        version = re.search(r"__version__ = '([^']+)'", z.read("torch/version.py").decode())[1]
    torch_dir = unpack(
        torch_wheel, cache / f"torch-{version}", r"torch/(include/|lib/libc10\.so|utils/cpp_ext)"
    )
    torch_nvcc = torch_flags((torch_dir / "torch/utils/cpp_extension.py").read_text())
    if list(NVCC_FLAGS[: len(torch_nvcc)]) != torch_nvcc:
        raise PrebuildError(f"torch {version}'s COMMON_NVCC_FLAGS are {torch_nvcc}: update NVCC_FLAGS")
    # torch >= 2.7 is built with the C++11 ABI and no longer passes the flag: check its library
    abi = int(b"St7__cxx1112basic_string" in (torch_dir / "torch/lib/libc10.so").read_bytes())
    (kit_wheel,) = download(cache, f"cuda-toolkit=={cuda_toolkit_pin(meta)}")
    with zipfile.ZipFile(kit_wheel) as z:
        kit_meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    parts = toolkit_parts(kit_meta)
    kit = {"cuda-toolkit": cuda_toolkit_pin(meta), **parts}
    wheels = {"torch": torch_wheel, "cuda-toolkit": kit_wheel}
    wheels.update(zip(parts, download(cache, *(f"{n}=={v}" for n, v in parts.items()))))
    cuda_root = cache / f"cuda-{kit['cuda-toolkit']}"
    for name in parts:
        unpack(wheels[name], cuda_root, r"nvidia/")
    nvcc = next(cuda_root.glob("nvidia/*/bin/nvcc"))
    for tool in [*nvcc.parent.iterdir(), *nvcc.parents[1].glob("nvvm/bin/*")]:
        if tool.is_file():
            tool.chmod(0o755)
    (gsplat_wheel,) = download(cache, f"gsplat=={p['gsplat']}")
    gsplat_dir = unpack(gsplat_wheel, cache / f"gsplat-{p['gsplat']}", r"gsplat/cuda/")
    return {
        "torch": version, "torch_include": torch_dir / "torch/include", "cxx11_abi": abi,
        "cuda_home": nvcc.parents[1], "nvcc": nvcc, "toolkit": kit,
        "wheels": {n: (w.name, sha256(w)) for n, w in wheels.items()} | {"gsplat": (gsplat_wheel.name, sha256(gsplat_wheel))},
        "gsplat_cuda": gsplat_dir / "gsplat/cuda",
    }  # fmt: skip


def sources(gsplat_cuda: Path) -> dict[str, str]:
    """``{object name: source relative to gsplat/cuda}`` of the 28 objects, as gsplat's
    _backend globs them (``csrc/*.cu``, ``csrc/*.cpp``), ext.cpp left to the device."""
    out = {}
    for src in sorted(gsplat_cuda.glob("csrc/*.cu")) + sorted(gsplat_cuda.glob("csrc/*.cpp")):
        out[src.stem + (".cuda.o" if src.suffix == ".cu" else ".o")] = f"csrc/{src.name}"
    return out


def compile_commands(tc: dict, staging: Path) -> dict[str, list[str]]:
    g = tc["gsplat_cuda"]
    inc = [f"-I{g / 'include'}", f"-I{g / 'csrc/third_party/glm'}"]
    t = tc["torch_include"]
    inc += ["-isystem", str(t), "-isystem", str(t / "torch/csrc/api/include")]
    inc += ["-isystem", str(tc["cuda_home"] / "include")]
    abi = [f"-D_GLIBCXX_USE_CXX11_ABI={tc['cxx11_abi']}"]
    f = flags()
    cxx = os.environ.get("CXX", "c++")
    out = {}
    for obj, src in sources(g).items():
        if src.endswith(".cu"):
            head = [str(tc["nvcc"]), "-ccbin", cxx, *f["cuda"], *abi]
        else:
            head = [cxx, *f["cxx"], *abi]
        out[obj] = [*head, *inc, "-c", str(g / src), "-o", str(staging / obj)]
    return out


def build(cache: Path, out: Path, jobs: int) -> dict:
    """Compile the 28 objects for :data:`ARCH` into ``out`` (replaced whole at the end); the
    objects of an unchanged command are reused from ``cache``'s staging folder."""
    start = time.perf_counter()
    tc = toolchain(cache)
    staging = cache / f"objects-gsplat{pins()['gsplat']}-torch{tc['torch']}-{ARCH}"
    staging.mkdir(parents=True, exist_ok=True)
    commands = compile_commands(tc, staging)
    env = {**os.environ, "PATH": f"{tc['nvcc'].parent}:{os.environ['PATH']}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)

    def run(obj: str) -> str:
        stamp = staging / f"{obj}.cmd"
        cmd = commands[obj]
        if stamp.exists() and stamp.read_text() == " ".join(cmd) and (staging / obj).exists():
            return f"{obj}: unchanged"
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise PrebuildError(f"{obj}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        stamp.write_text(" ".join(cmd))
        return f"{obj}: {time.perf_counter() - t:.0f} s"

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(run, commands):
            print(line, flush=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    nvcc = subprocess.run([str(tc["nvcc"]), "--version"], capture_output=True, text=True).stdout
    cc = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True, text=True)
    g = tc["gsplat_cuda"]
    manifest = {
        "format": FORMAT,
        **pins(),
        "torch_build": tc["torch"],
        "cuda": tc["toolkit"]["nvidia-cuda-nvcc"].rsplit(".", 1)[0],
        "cxx11_abi": tc["cxx11_abi"],
        "toolkit": tc["toolkit"],
        "nvcc_version": nvcc.strip().splitlines()[-2],
        "host_compiler": cc.stdout.splitlines()[0],
        "flags": flags(),
        "wheels": {n: {"file": f, "sha256": s} for n, (f, s) in tc["wheels"].items()},
        "ext_sha256": sha256(g / "ext.cpp"),
        "objects": {
            obj: {"source": src, "source_sha256": sha256(g / src),
                  "sha256": sha256(staging / obj), "bytes": (staging / obj).stat().st_size}
            for obj, src in sources(g).items()
        },  # fmt: skip
        "build_seconds": round(time.perf_counter() - start),
        "cpu_seconds": round(sum(getattr(after, k) - getattr(before, k) for k in ("ru_utime", "ru_stime"))),
        "jobs": jobs,
        "built": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix=".kernels-", dir=out.parent))
    (tmp / "objects").mkdir()
    for obj in manifest["objects"]:
        shutil.copy2(staging / obj, tmp / "objects" / obj)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise PrebuildError(f"{folder}: no manifest.json (build it: python bench/gsplat_prebuild.py build)") from None
    except (OSError, ValueError) as exc:
        raise PrebuildError(f"{path}: not a manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PrebuildError(f"{path}: format {manifest.get('format') if isinstance(manifest, dict) else '?'}, expected {FORMAT}")
    return manifest  # fmt: skip


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
        out.append(f"torch_build: {manifest.get('torch_build')!r} is not a CUDA build of the pinned torch")
    out += object_problems(folder, manifest)
    gsplat = next(Path(wheels).glob("gsplat-*.whl"), None) if wheels else None
    built_from = (manifest.get("wheels") or {}).get("gsplat", {})
    if gsplat is not None and sha256(gsplat) != built_from.get("sha256"):
        out.append(f"{gsplat.name}: not the wheel the kernels were compiled from ({built_from.get('file')})")
    return out  # fmt: skip


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
        extra_include_paths=[str(gsplat_cuda / "include"), str(gsplat_cuda / "csrc/third_party/glm")],
        build_directory=str(build_dir),
        with_cuda=True,
        verbose=True,
    )  # fmt: skip
    if not hasattr(module, "null"):  # ext.cpp's first binding: the objects' functions are there
        raise PrebuildError(f"{module.__file__}: gsplat's bindings are missing")
    target = gsplat_cuda.parent / f"{MODULE}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    shutil.copy2(module.__file__, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gsplat_prebuild.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the objects here (no GPU)")
    b.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "chord-gsplat-prebuild")
    b.add_argument("--out", type=Path, default=ROOT / ".kernels")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    c = sub.add_parser("check", help="the folder is current for the pins (exit 1 if not)")
    c.add_argument("folder", type=Path, nargs="?", default=ROOT / ".kernels")
    c.add_argument("--wheels", type=Path, help="the carried wheels: gsplat's must be the one built from")
    k = sub.add_parser("link", help="on the device: ext.cpp compiled, the objects linked, gsplat.csrc")
    k.add_argument("folder", type=Path, nargs="?", default=ROOT / ".kernels")
    k.add_argument("--site", type=Path, required=True, help="where gsplat is installed")
    args = parser.parse_args(argv)  # fmt: skip
    try:
        if args.command == "build":
            if args.jobs < 1:
                raise PrebuildError(f"--jobs: at least 1, got {args.jobs}")
            m = build(args.cache, args.out, args.jobs)
            size = sum(o["bytes"] for o in m["objects"].values())
            print(f"{args.out}: {len(m['objects'])} objects for {ARCH}, {size / 2**20:.1f} MiB, "
                  f"{m['build_seconds']} s ({m['cpu_seconds']} CPU-s, {args.jobs} jobs); {m['nvcc_version']}")  # fmt: skip
        elif args.command == "check":
            bad = problems(args.folder, args.wheels)
            if bad:
                raise PrebuildError(f"{args.folder}: stale kernels:\n  " + "\n  ".join(bad)
                                    + "\nrebuild: python bench/gsplat_prebuild.py build")  # fmt: skip
            m = read_manifest(args.folder)
            size = sum(o["bytes"] for o in m["objects"].values())
            print(f"{args.folder}: gsplat {m['gsplat']}'s {len(m['objects'])} objects for {ARCH}, "
                  f"torch {m['torch_build']}, nvcc {m['toolkit']['nvidia-cuda-nvcc']}, {size / 2**20:.1f} MiB")  # fmt: skip
        else:
            print(f"gsplat's prebuilt kernels: {link(args.folder, args.site)}")
    except PrebuildError as exc:
        print(f"gsplat_prebuild.py {args.command}: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"gsplat_prebuild.py {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
gsplat's ``_backend`` imports before it tries a JIT build (chord.render.gsplat_backend). The
folder's pins, check and link are bench/gsplat_kernels.py's; this module builds it.

    python bench/gsplat_prebuild.py build [--cache DIR] [--out .kernels] [--jobs N]   # here
    python bench/gsplat_prebuild.py check [FOLDER] [--wheels .whl]  # here: FOLDER is current
    python bench/gsplat_prebuild.py link [FOLDER] --site /tmp/site  # there: gsplat.csrc

``build`` downloads into ``--cache`` (about 1 GB with what it unpacks; never the
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
import json
import os
import re
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
from bench.gsplat_kernels import (  # noqa: E402
    ARCH,
    FORMAT,
    NVCC_FLAGS,
    ROOT,
    PrebuildError,
    flags,
    link,
    pins,
    problems,
    read_manifest,
    sha256,
    sources,
)

#: the toolkit parts nvcc needs, as extras of torch's ``cuda-toolkit`` pin
TOOLKIT_EXTRAS = ("nvcc", "crt", "nvvm", "cccl", "cudart")
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


def torch_flags(cpp_extension_source: str) -> list[str]:
    """``COMMON_NVCC_FLAGS`` of a torch's ``torch/utils/cpp_extension.py``, read, not run."""
    for node in ast.parse(cpp_extension_source).body:
        if (
            isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") == "COMMON_NVCC_FLAGS"
        ):
            return ast.literal_eval(node.value)
    raise PrebuildError("torch's cpp_extension.py has no COMMON_NVCC_FLAGS")


def requirements(metadata: str) -> list[Requirement]:
    return [
        Requirement(line.split(":", 1)[1])
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]


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
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        pins()["python"],
        "--implementation",
        "cp",
        "-d",
        str(folder),
    ]
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
        raise PrebuildError(
            f"torch {version}'s COMMON_NVCC_FLAGS are {torch_nvcc}: update NVCC_FLAGS"
        )
    # torch >= 2.7 is built with the C++11 ABI and no longer passes the flag: check its library
    abi = int(b"St7__cxx1112basic_string" in (torch_dir / "torch/lib/libc10.so").read_bytes())
    (kit_wheel,) = download(cache, f"cuda-toolkit=={cuda_toolkit_pin(meta)}")
    with zipfile.ZipFile(kit_wheel) as z:
        kit_meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    parts = toolkit_parts(kit_meta)
    kit = {"cuda-toolkit": cuda_toolkit_pin(meta), **parts}
    wheels = {"torch": torch_wheel, "cuda-toolkit": kit_wheel}
    wheels.update(
        zip(parts, download(cache, *(f"{n}=={v}" for n, v in parts.items())), strict=True)
    )
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
        "torch": version,
        "torch_include": torch_dir / "torch/include",
        "cxx11_abi": abi,
        "cuda_home": nvcc.parents[1],
        "nvcc": nvcc,
        "toolkit": kit,
        "wheels": {n: (w.name, sha256(w)) for n, w in wheels.items()}
        | {"gsplat": (gsplat_wheel.name, sha256(gsplat_wheel))},
        "gsplat_cuda": gsplat_dir / "gsplat/cuda",
    }


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
    times: dict[str, dict] = {}  # per object: its command, wall and CPU seconds
    reused: dict[str, bool] = {}

    def run(obj: str) -> str:
        """Compile ``obj`` unless its stamp has the same command; the stamp keeps the command,
        its wall and CPU seconds (nvcc's and its children's, from wait4)."""
        stamp = staging / f"{obj}.json"
        cmd = commands[obj]
        old = json.loads(stamp.read_text()) if stamp.exists() else {}
        if old.get("cmd") == cmd and (staging / obj).exists():
            times[obj], reused[obj] = old, True
            return f"{obj}: unchanged"
        t = time.perf_counter()
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=err, stderr=err, text=True)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode:
                err.seek(0)
                raise PrebuildError(f"{obj}: exit {proc.returncode}: {err.read().strip()[-2000:]}")
        times[obj] = {
            "cmd": cmd,
            "seconds": round(time.perf_counter() - t, 1),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        }
        stamp.write_text(json.dumps(times[obj]))
        return f"{obj}: {times[obj]['seconds']:.0f} s, {times[obj]['cpu_seconds']:.0f} CPU-s"

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(run, commands):
            print(line, flush=True)
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
            obj: {
                "source": src,
                "source_sha256": sha256(g / src),
                "sha256": sha256(staging / obj),
                "bytes": (staging / obj).stat().st_size,
                "cpu_seconds": times[obj]["cpu_seconds"],
            }
            for obj, src in sources(g).items()
        },
        "build_seconds": round(time.perf_counter() - start),
        # the objects' compilers, whenever they ran (an unchanged object is reused)
        "cpu_seconds": round(sum(t["cpu_seconds"] for t in times.values())),
        "reused": len(reused),
        "jobs": jobs,
        "built": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    tmp = Path(tempfile.mkdtemp(prefix=".kernels-", dir=out.parent))
    (tmp / "objects").mkdir()
    for obj in manifest["objects"]:
        shutil.copy2(staging / obj, tmp / "objects" / obj)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gsplat_prebuild.py", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the objects here (no GPU)")
    b.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "chord-gsplat-prebuild")
    b.add_argument("--out", type=Path, default=ROOT / ".kernels")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    c = sub.add_parser("check", help="the folder is current for the pins (exit 1 if not)")
    c.add_argument("folder", type=Path, nargs="?", default=ROOT / ".kernels")
    c.add_argument(
        "--wheels", type=Path, help="the carried wheels: gsplat's must be the one built from"
    )
    k = sub.add_parser(
        "link", help="on the device: ext.cpp compiled, the objects linked, gsplat.csrc"
    )
    k.add_argument("folder", type=Path, nargs="?", default=ROOT / ".kernels")
    k.add_argument("--site", type=Path, required=True, help="where gsplat is installed")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            if args.jobs < 1:
                raise PrebuildError(f"--jobs: at least 1, got {args.jobs}")
            m = build(args.cache, args.out, args.jobs)
            size = sum(o["bytes"] for o in m["objects"].values())
            print(
                f"{args.out}: {len(m['objects'])} objects for {ARCH}, {size / 2**20:.1f} MiB, "
                f"{m['build_seconds']} s ({m['cpu_seconds']} CPU-s, {args.jobs} jobs); "
                f"{m['nvcc_version']}"
            )
        elif args.command == "check":
            bad = problems(args.folder, args.wheels)
            if bad:
                raise PrebuildError(
                    f"{args.folder}: stale kernels:\n  "
                    + "\n  ".join(bad)
                    + "\nrebuild: python bench/gsplat_prebuild.py build"
                )
            m = read_manifest(args.folder)
            size = sum(o["bytes"] for o in m["objects"].values())
            print(
                f"{args.folder}: gsplat {m['gsplat']}'s {len(m['objects'])} objects for {ARCH}, "
                f"torch {m['torch_build']}, nvcc {m['toolkit']['nvidia-cuda-nvcc']}, "
                f"{size / 2**20:.1f} MiB"
            )
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

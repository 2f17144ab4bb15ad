"""A CUDA device a CPU build of torch can pretend to have, for :mod:`chord.checks.fake_cuda`.

Fake tensors (``torch._subclasses.fake_tensor``) on ``cuda:0`` carry shapes, dtypes and devices
without data, so the GPU path's own code runs on any machine. A CPU build of torch lacks two
things they still touch: a device guard for CUDA (autograd records a stream per device: without
one, the first op that needs a gradient aborts the process, "PyTorch is not linked with support
for cuda devices"; ``torch._C._ensureCUDADeviceGuardSet`` only replaces an existing guard, it
does not add a missing one), and CUDA hooks saying a device exists (the autograd engine asks the
accelerator for the current stream: "Cannot access accelerator device when none is available").

This module compiles a small C++ library (:data:`SOURCE`) against the installed torch that
registers c10's own ``FakeGuardImpl`` for CUDA and hooks that report one CUDA device and do
nothing else (no memory, no kernels: every op on a fake tensor runs its meta function). It is
compiled once per torch build with the system's C++ compiler (``$CXX``, else ``g++``; about 2 s)
into a cache folder, and loaded with ``ctypes``. torch reads its hooks once, on import, so the
library must be loaded before ``import torch``: :func:`load` refuses otherwise, and the faked
runs happen in a fresh interpreter (``python -m chord.checks.fake_iteration``).

Nothing here imports torch: its folder is found from the import system.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = r"""
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace chord_fake_cuda {
// One CUDA device that exists for the dispatcher and the autograd engine, and nothing more.
struct CUDAHooks final : at::CUDAHooksInterface {
  explicit CUDAHooks(at::CUDAHooksArgs) {}
  void init() const override {}
  bool hasCUDA() const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
};

struct Register {
  Register() {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA))
      c10::impl::registerDeviceGuard(
          c10::DeviceType::CUDA, new c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>());
  }
} registered;
}  // namespace chord_fake_cuda

namespace at {
using chord_fake_cuda::CUDAHooks;
REGISTER_CUDA_HOOKS(CUDAHooks);
}  // namespace at
"""


class ShimError(RuntimeError):
    """The fake CUDA device cannot be set up here (no compiler, a CUDA build, torch imported)."""


def torch_folder() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ShimError("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "chord" / "fake_cuda"


def library_path(torch_dir: Path | None = None) -> Path:
    """Where the compiled library of this torch build and :data:`SOURCE` lives."""
    torch_dir = torch_dir or torch_folder()
    key = hashlib.sha256(SOURCE.encode())
    for lib in ("libc10.so", "libtorch_cpu.so"):
        stat = (torch_dir / "lib" / lib).stat()
        key.update(f"{lib}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_folder() / f"fake_cuda-{key.hexdigest()[:16]}.so"


def build(torch_dir: Path | None = None) -> Path:
    """The library for the installed torch, compiled when the cache lacks it."""
    torch_dir = torch_dir or torch_folder()
    if (torch_dir / "lib" / "libc10_cuda.so").exists():
        raise ShimError(
            "this torch is a CUDA build: it has CUDA's own device guard and hooks, and a faked "
            "device would stand beside a real one; run the faked check with the CPU build "
            "(pip install torch==2.13.0 on a machine without a GPU)"
        )
    out = library_path(torch_dir)
    if out.exists():
        return out
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise ShimError("no C++ compiler (set CXX, or install g++): the fake CUDA device needs one")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".cpp")
    src.write_text(SOURCE)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [
        compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-w",
        f"-I{torch_dir / 'include'}", str(src), f"-L{torch_dir / 'lib'}",
        "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", str(tmp),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        why = proc.stderr[-2000:]
        raise ShimError(f"compiling the fake CUDA device failed ({compiler}):\n{why}")
    os.replace(tmp, out)  # atomic: a concurrent build finds a whole library or none
    return out


def load() -> Path:
    """Build (if needed) and load the library, before torch is imported; returns its path."""
    if "torch" in sys.modules:
        raise ShimError(
            "torch is already imported: it has read its CUDA hooks, so the fake CUDA device "
            "must be loaded first (run the check in a fresh interpreter: python -m "
            "chord.checks.fake_iteration)"
        )
    path = build()
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise ShimError(f"{path}: the cached fake CUDA device does not load ({exc}); delete it "
                        "and run again (it is rebuilt)") from exc  # fmt: skip
    return path

"""The CUDA backend (:class:`chord.render.backend.RenderBackend`): gsplat's ``rasterization``
with METHOD §8's settings, and the build of gsplat's kernels: once per card kind, never two
builds at once.

How gsplat 1.5 gets its kernels (``gsplat/cuda/_backend.py``, imported lazily by the first
CUDA call): a prebuilt ``gsplat.csrc`` if the wheel has one, else, when a CUDA toolkit (nvcc)
is found, a JIT build of the extension ``gsplat_cuda`` in torch's build folder
``torch.utils.cpp_extension._get_build_directory("gsplat_cuda")``: ``$TORCH_EXTENSIONS_DIR/
gsplat_cuda``, or ``~/.cache/torch_extensions/py<ver>_cu<ver>/gsplat_cuda``. On import it
deletes that folder's ``lock`` file unconditionally (torch's FileBaton, which another process
building there holds) and, when no ``gsplat_cuda.so`` is there yet, deletes the whole folder
(another process's half-built objects with it) and builds; torch compiles for
``TORCH_CUDA_ARCH_LIST``, else for the capabilities of the visible GPUs. So jobs starting at
once on a shared folder corrupt each other's build, and a ``.so`` built on one card kind
(or for a site's TORCH_CUDA_ARCH_LIST) fails on another with "no kernel image is available".

chord therefore imports that module only through :func:`load_kernels`: with
``TORCH_EXTENSIONS_DIR`` pointed at a folder of its own per gsplat/torch/CUDA/Python build and
compute capability (:func:`extensions_dir`, e.g. ``<root>/chord-gsplat/gsplat1.5.3-torch2.8.0-
cu128-py311/sm_90``), ``TORCH_CUDA_ARCH_LIST`` set to that card's capability, both only for the
import, and an exclusive lock on that folder (``fcntl.lockf``: POSIX record locks, which work
across the nodes of an NFS home and are dropped by the kernel when a job dies), so concurrent
jobs and ranks wait for the first build and then load it. The first job on a card kind builds
(minutes); ``chord build-kernels`` on a GPU node builds ahead of a run.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path

from chord.render.raster_inputs import RasterInputs, RasterSettings

logger = logging.getLogger(__name__)

#: its name in ``render_backend``
NAME = "gsplat"
#: gsplat 1.5's JIT extension (the name its _backend passes to torch's build)
EXTENSION = "gsplat_cuda"
#: the lock file chord holds around the import (gsplat deletes torch's own ``lock`` file)
LOCK_NAME = "chord-build.lock"
#: the environment the import reads: torch's build root, and the architectures nvcc targets
ENV_KEYS = ("TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST")


def capability_tag(capability: tuple[int, int]) -> str:
    """``sm_90`` for compute capability (9, 0)."""
    major, minor = capability
    return f"sm_{major}{minor}"


def build_key() -> str:
    """The builds whose kernels are interchangeable: gsplat, torch (without its local tag),
    torch's CUDA and Python versions, e.g. ``gsplat1.5.3-torch2.8.0-cu128-py311``."""
    import gsplat
    import torch

    cuda = (torch.version.cuda or "none").replace(".", "")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return f"gsplat{gsplat.__version__}-torch{torch.__version__.split('+')[0]}-cu{cuda}-{python}"


def extensions_root(env: MutableMapping[str, str] | None = None) -> Path:
    """Where torch builds extensions: ``$TORCH_EXTENSIONS_DIR`` (a site may point it at a
    shared disk), else torch's per-user cache folder."""
    from torch.utils.cpp_extension import get_default_build_root

    env = os.environ if env is None else env
    return Path(env.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def extensions_dir(
    capability: tuple[int, int], env: MutableMapping[str, str] | None = None
) -> Path:
    """chord's TORCH_EXTENSIONS_DIR for gsplat's kernels on a card of ``capability``:
    ``<root>/chord-gsplat/<build key>/sm_<major><minor>``; gsplat builds in its ``gsplat_cuda``
    subfolder."""
    return extensions_root(env) / "chord-gsplat" / build_key() / capability_tag(capability)


@contextlib.contextmanager
def build_env(
    folder: Path, capability: tuple[int, int], env: MutableMapping[str, str] | None = None
) -> Iterator[None]:
    """``TORCH_EXTENSIONS_DIR=folder`` and ``TORCH_CUDA_ARCH_LIST`` = the card's capability
    (e.g. "9.0", whatever the site set) while gsplat imports, the previous values after: other
    JIT extensions of the process (optimum-quanto's, say) keep building where they did."""
    env = os.environ if env is None else env
    saved = {k: env.get(k) for k in ENV_KEYS}
    env["TORCH_EXTENSIONS_DIR"] = str(folder)
    env["TORCH_CUDA_ARCH_LIST"] = "{}.{}".format(*capability)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (created if missing) for its holder's whole import or
    build; another process waits, saying so once, then gets the finished folder."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a+") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            logger.info("gsplat: waiting for another process's kernel build in %s", folder)
            start = time.perf_counter()
            fcntl.lockf(f, fcntl.LOCK_EX)
            logger.info(
                "gsplat: waited %.0f s for the build in %s", time.perf_counter() - start, folder
            )
        try:
            yield
        finally:
            fcntl.lockf(f, fcntl.LOCK_UN)


def built(folder: Path) -> bool:
    """Whether ``folder`` holds a linked extension (gsplat's own test for "built")."""
    build = folder / EXTENSION
    return (build / f"{EXTENSION}.so").exists() or (build / f"{EXTENSION}.lib").exists()


def _import_gsplat_kernels():
    """gsplat's own import and JIT build path, unpatched: its ``_C`` (None without nvcc)."""
    from gsplat.cuda._backend import _C

    return _C


def load_kernels(
    capability: tuple[int, int],
    *,
    rebuild: bool = False,
    builder: Callable[[], object] = _import_gsplat_kernels,
    env: MutableMapping[str, str] | None = None,
):
    """gsplat's CUDA extension for a card of ``capability``, built first if needed, under
    :func:`build_lock` and :func:`build_env` (``builder``: gsplat's import; tests pass a
    stand-in). ``rebuild`` deletes this capability's build first (a build left broken).
    Returns what ``builder`` returns."""
    if "gsplat.cuda._backend" in sys.modules and builder is _import_gsplat_kernels:
        return _import_gsplat_kernels()  # imported already in this process: one build per process
    folder = extensions_dir(capability, env)
    with build_lock(folder):
        if rebuild:
            shutil.rmtree(folder / EXTENSION, ignore_errors=True)
        fresh = not built(folder)
        start = time.perf_counter()
        with build_env(folder, capability, env):
            kernels = builder()
        if fresh and built(folder):
            logger.info(
                "gsplat: built its kernels for %s in %.0f s in %s",
                capability_tag(capability),
                time.perf_counter() - start,
                folder,
            )
    return kernels


def device_capability(device=None) -> tuple[int, int]:
    """The compute capability of ``device`` (the current CUDA device by default)."""
    import torch

    return tuple(torch.cuda.get_device_capability(device))


def cannot_build_reason() -> str | None:
    """Why this machine cannot build gsplat's kernels (no CUDA GPU: they are built for the
    card that runs them), or None."""
    import torch

    if not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        return (
            f"torch {torch.__version__} ({build}) sees no CUDA GPU: gsplat's kernels are built "
            "for the compute capability of the card that runs them, so build them on a GPU "
            "node (e.g. srun --gpus=1 chord build-kernels, once per GPU kind)"
        )
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """Why gsplat's CUDA kernels cannot run here, or None when they load (probed once per
    process, on the current CUDA device; gsplat is never patched). The first call on a card
    kind builds them (:func:`load_kernels`: minutes, once, under the lock); without a CUDA
    toolkit (nvcc) gsplat's extension is None."""
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    try:
        import gsplat
    except ImportError as exc:
        return f"gsplat is not installed ({exc})"
    capability = device_capability()
    try:
        kernels = load_kernels(capability)
    except Exception as exc:  # a failed JIT build of the extension
        return (
            f"gsplat {gsplat.__version__}'s CUDA kernels failed to build for "
            f"{capability_tag(capability)} in {extensions_dir(capability)} ({exc})"
        )
    if kernels is None:
        return (
            f"gsplat {gsplat.__version__} found no CUDA toolkit (nvcc under CUDA_HOME or on "
            "PATH) to compile its kernels, and no prebuilt ones"
        )
    return None


def available() -> bool:
    """Whether gsplat's CUDA extension loads."""
    return unavailable_reason() is None


def kernels_file() -> str | None:
    """The file gsplat's loaded extension came from (its JIT ``gsplat_cuda.so`` or a wheel's
    ``csrc``), None before :func:`load_kernels` or without one."""
    backend = sys.modules.get("gsplat.cuda._backend")
    return getattr(getattr(backend, "_C", None), "__file__", None)


def describe() -> str:
    """Which gsplat renders (for logs and state files)."""
    import gsplat

    return f"gsplat {gsplat.__version__} (CUDA kernels)"


def rasterize(inputs: RasterInputs, settings: RasterSettings):
    """gsplat's ``rasterization`` (packed=False, absgrad, antialiased) of ``inputs``; its kernels
    loaded through :func:`load_kernels` first, never by gsplat's own lazy import."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"gsplat cannot render here: {reason}")
    from gsplat import rasterization

    rgb, alpha, meta = rasterization(
        inputs.means,
        inputs.quats,
        inputs.scales,
        inputs.opacities,
        inputs.colors,
        inputs.viewmats,
        inputs.Ks,
        settings.width,
        settings.height,
        near_plane=settings.near_plane,
        far_plane=settings.far_plane,
        eps2d=settings.eps2d,
        sh_degree=inputs.sh_degree,
        packed=False,
        absgrad=True,
        rasterize_mode="antialiased",
        backgrounds=inputs.backgrounds,
    )
    return rgb, alpha, meta

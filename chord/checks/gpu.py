"""The GPU rows: CUDA and its device (:func:`check_cuda`), and gsplat's kernels built for this
card, launched on it and, for ``chord doctor``, compared with the torch rasterizer
(:func:`check_renderer`, :func:`build_kernels`)."""

from __future__ import annotations

import os
import shutil

from chord.checks.report import FAIL, NA, PASS, Check
from chord.resources import gpus, peak_memory

GiB = peak_memory.GiB


def check_cuda(needs_gpu: bool) -> Check:
    """CUDA, the device and its memory; torch's build against the machine's GPUs."""
    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return Check(
            "cuda",
            PASS,
            f"{p.name}, {p.total_memory / GiB:.1f} GiB, {torch.cuda.device_count()} "
            f"GPU(s), torch {torch.__version__} (CUDA {torch.version.cuda})",
        )
    listed = gpus.visible_gpus(os.environ) if shutil.which("nvidia-smi") else []
    if listed or needs_gpu:
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        where = f"nvidia-smi lists {len(listed)} GPU(s) but " if listed else ""
        return Check(
            "cuda",
            FAIL,
            f"{where}torch {torch.__version__} ({build}) sees no CUDA GPU",
            "run on a GPU node with a CUDA build of torch (pip install torch from "
            "https://download.pytorch.org/whl/<cuda version>, then pip install -e .)",
        )
    return Check("cuda", NA, "no CUDA GPU here: needed by the wan teacher and gsplat")


def check_renderer(backend: str, *, parity: bool, device=None) -> Check:
    """gsplat's kernels load (built for this card first: :func:`chord.render.gsplat_backend.
    load_kernels`) and run on ``device`` (the current CUDA device): a forward and backward
    render launches them on the card itself, where a build for another card fails with "no
    kernel image"; with ``parity`` they also agree with the torch rasterizer."""
    import torch

    from chord.render import backend as render_backend
    from chord.render import gsplat_backend

    if backend == "torch":
        return Check("gsplat", NA, "render_backend: torch (the torch rasterizer everywhere)")
    if not torch.cuda.is_available():
        return Check(
            "gsplat",
            NA,
            "needs a CUDA GPU (gsplat's kernels are CUDA-only); on a CPU the torch rasterizer "
            "renders",
        )
    device = torch.device("cuda" if device is None else device)
    try:
        render_backend.resolve_backend(backend, device)
    except render_backend.BackendUnavailable as exc:
        reason, _, fix = str(exc).partition(". Fix: ")
        return Check("gsplat", FAIL, reason, fix)
    tag = gsplat_backend.capability_tag(gsplat_backend.device_capability(device))
    detail = (
        f"{render_backend.describe_backend('gsplat')} on {tag}: {gsplat_backend.kernels_file()}"
    )
    try:
        if parity:
            diff, alpha = renderer_parity(device)
        else:
            launch_kernels(device)
    except Exception as exc:  # e.g. "no kernel image is available for execution on the device"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Check(
            "gsplat",
            FAIL,
            f"{detail}: a render on {torch.cuda.get_device_name(device)} failed: {first}",
            "rebuild the kernels for this card (chord build-kernels --rebuild on this node), or "
            "render_backend: torch",
        )
    if parity:
        if diff > 2e-3 or alpha > 2e-2:
            return Check(
                "gsplat",
                FAIL,
                f"{detail} disagrees with the torch rasterizer: mean |colour diff| {diff:.2g}, "
                f"max |alpha diff| {alpha:.2g}",
                "report it with the gsplat and torch versions; render_backend: torch avoids it",
            )
        detail += f"; agrees with the torch rasterizer (mean |diff| {diff:.1g})"
    else:
        detail += "; forward and backward kernels ran"
    return Check("gsplat", PASS, detail)


def _parity_scene() -> tuple:
    """200 random Gaussians and one camera at 64x48 (CPU tensors): the renderer checks' scene."""
    import torch

    from chord.render import cameras

    g = torch.Generator().manual_seed(0)
    n = 200
    means = (torch.rand(n, 3, generator=g) - 0.5) * 0.8
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.05 + 0.01
    opac = torch.rand(n, generator=g) * 0.8 + 0.1
    colors = torch.rand(n, 3, generator=g)
    view = cameras.orbit_viewmats(torch.tensor([15.0]), torch.tensor([60.0]), 2.0).float()
    K = cameras.intrinsics(64, 48).float()[None]
    return means, quats, scales, opac, colors, view, K


def launch_kernels(device=None):
    """gsplat's forward and backward kernels on ``device`` (the current CUDA device), on the
    parity scene, synchronised so a launch error surfaces here: colours and alphas (CPU)."""
    import torch

    from chord.render.rasterizer import rasterize

    device = torch.device("cuda" if device is None else device)
    means, *rest = (t.to(device) for t in _parity_scene())
    means.requires_grad_(True)
    out, out_a, _ = rasterize(means, *rest, 64, 48, backend="gsplat")
    (out.sum() + out_a.sum()).backward()
    torch.cuda.synchronize(device)
    if not bool(torch.isfinite(means.grad).all()):
        raise RuntimeError("gsplat's backward kernels returned non-finite gradients")
    return out.detach().cpu(), out_a.detach().cpu()


def renderer_parity(device=None) -> tuple[float, float]:
    """Mean |colour| and max |alpha| difference of gsplat on ``device`` (CUDA) against the
    torch rasterizer on the CPU, on 200 random Gaussians at 64x48."""
    from chord.render.rasterizer import rasterize

    ref, ref_a, _ = rasterize(*_parity_scene(), 64, 48, backend="torch")
    out, out_a = launch_kernels(device)
    return float((out - ref).abs().mean()), float((out_a - ref_a).abs().max())


def build_kernels(*, rebuild: bool = False) -> list[Check]:
    """``chord build-kernels``: gsplat's kernels built for this node's card (once per card
    kind and gsplat/torch build, under the lock; ``rebuild`` deletes that build first), then
    launched on it (the ``gsplat`` row with parity). On a machine without CUDA one failing row
    that says why it cannot build."""
    import time

    import torch

    from chord.render import gsplat_backend

    reason = gsplat_backend.cannot_build_reason()
    if reason is not None:
        return [Check("gsplat build", FAIL, reason, "run it on a GPU node")]
    capability = gsplat_backend.device_capability()
    tag = gsplat_backend.capability_tag(capability)
    folder = gsplat_backend.extensions_dir(capability)
    card = f"{torch.cuda.get_device_name()} ({tag})"
    fresh = not gsplat_backend.built(folder) or rebuild
    start = time.perf_counter()
    try:
        kernels = gsplat_backend.load_kernels(capability, rebuild=rebuild)
    except Exception as exc:
        return [
            Check(
                "gsplat build",
                FAIL,
                f"{card}: the build in {folder} failed: {exc}",
                "a CUDA toolkit matching torch's CUDA (nvcc, CUDA_HOME); VERBOSE=1 shows nvcc",
            )
        ]
    if kernels is None:
        return [
            Check(
                "gsplat build",
                FAIL,
                f"{card}: gsplat found no CUDA toolkit (nvcc under CUDA_HOME or on PATH)",
                f"install one matching torch's CUDA {torch.version.cuda} and set CUDA_HOME",
            )
        ]
    how = f"built in {time.perf_counter() - start:.0f} s" if fresh else "built before"
    row = Check("gsplat build", PASS, f"{card}: {gsplat_backend.kernels_file()} ({how})")
    return [row, check_renderer("gsplat", parity=True)]

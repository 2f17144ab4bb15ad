"""The checks a training runs at its start (:func:`preflight`), and that ``chord doctor`` runs
on a GPU node before a long run, so that what would fail hours in (a missing gsplat build, an
incomplete Wan folder, a Tiny VAE file with other keys, too little host RAM for the experts, a
full disk) fails in the first minute instead.

Each check gives one row: pass, fail (with the remedy) or n/a (with why: most often that it
needs a GPU, or that the oracle teacher uses no weights).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from chord.core.errors import InputError
from chord.resources import cuda_settings, gpus, job_size, peak_memory
from chord.resources.machine import gpu_bytes, host_bytes

logger = logging.getLogger(__name__)

GiB, MiB = peak_memory.GiB, peak_memory.MiB
PASS, FAIL, NA = "pass", "fail", "n/a"
#: interface of a Wan 2.2 I2V A14B expert (transformer/config.json) the guidance relies on
I2V_INTERFACE = {"in_channels": 36, "out_channels": 16, "patch_size": [1, 2, 2]}
#: headroom kept free on the results disk besides the estimate (bytes)
DISK_MARGIN = GiB


@dataclass(frozen=True)
class Check:
    """One row of the table; ``fatal``: a failure a training must not start with."""

    name: str
    status: str
    detail: str
    remedy: str = ""
    fatal: bool = True


class PreflightError(InputError):
    """A training's preflight failed (exit 2); the message holds every failing row."""


def table(checks: Iterable[Check]) -> str:
    """The checks as one aligned text table (remedies on the line below a failure)."""
    checks = list(checks)
    width = max((len(c.name) for c in checks), default=5)
    lines = [f"{'check':<{width}}  status  detail"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.status:<6}  {c.detail}")
        if c.status == FAIL and c.remedy:
            lines.append(f"{'':<{width}}  {'':<6}  fix: {c.remedy}")
    return "\n".join(lines)


def failures(checks: Iterable[Check], *, fatal_only: bool = False) -> list[Check]:
    return [c for c in checks if c.status == FAIL and (c.fatal or not fatal_only)]


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

    from chord.render import gsplat_backend
    from chord.render.backend import BackendUnavailable, describe_backend, resolve_backend

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
        resolve_backend(backend, device)
    except BackendUnavailable as exc:
        reason, _, fix = str(exc).partition(". Fix: ")
        return Check("gsplat", FAIL, reason, fix)
    tag = gsplat_backend.capability_tag(gsplat_backend.device_capability(device))
    detail = f"{describe_backend('gsplat')} on {tag}: {gsplat_backend.kernels_file()}"
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


def _json(path: Path):
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_wan_folder(guidance) -> Check:
    """The Wan folder complete (every component's config and weights) and I2V A14B-shaped."""
    if guidance.backend != "wan":
        return Check("wan folder", NA, f"guidance.backend is {guidance.backend}: no Wan weights")
    from chord.guidance import wan_folder

    folder = Path(guidance.ckpt_dir)
    try:
        index = wan_folder.check_folder(folder)
    except ValueError as exc:
        return Check(
            "wan folder", FAIL, str(exc), "copy the whole Wan2.2-I2V-A14B-Diffusers folder"
        )
    problems = []
    experts = {n: _json(folder / n / "config.json") or {} for n in ("transformer", "transformer_2")}
    for name, cfg in experts.items():
        for key, want in I2V_INTERFACE.items():
            if cfg.get(key) != want:
                problems.append(f"{name}/config.json: {key} {cfg.get(key)!r}, expected {want!r}")
    shape_keys = ("num_layers", "num_attention_heads", "attention_head_dim", "ffn_dim", "text_dim")
    differ = [
        k for k in shape_keys if experts["transformer"].get(k) != experts["transformer_2"].get(k)
    ]
    if differ:
        problems.append(f"transformer and transformer_2 differ in {', '.join(differ)}")
    text = _json(folder / "text_encoder" / "config.json") or {}
    text_dim = experts["transformer"].get("text_dim")
    if text.get("d_model") is not None and text.get("d_model") != text_dim:
        problems.append(
            f"text_encoder/config.json: d_model {text.get('d_model')}, the experts' text_dim "
            f"is {text_dim}"
        )
    vae = _json(folder / "vae" / "config.json") or {}
    if vae.get("z_dim") != 16 or len(vae.get("latents_mean") or ()) != 16:
        problems.append("vae/config.json: expected z_dim 16 with 16 latents_mean/latents_std")
    ratio = index.get("boundary_ratio")
    if not isinstance(ratio, int | float) or not 0 < ratio < 1:
        problems.append(f"model_index.json: boundary_ratio {ratio!r}, expected e.g. 0.9")
    if problems:
        return Check(
            "wan folder",
            FAIL,
            f"{folder}: not Wan 2.2 I2V A14B-shaped: " + "; ".join(problems),
            "point guidance.ckpt_dir at a Wan2.2-I2V-A14B-Diffusers folder",
        )
    shape = peak_memory.ModelShape.from_folder(folder)
    return Check(
        "wan folder",
        PASS,
        f"{folder}: complete; experts {shape.describe()}, boundary {ratio}",
    )


def check_tiny_vae(
    guidance, methods: Iterable, *, reference: Path | None = None, device="cpu"
) -> Check:
    """The Tiny VAE file loads with the published (lighttaew2_1) keys and shapes, and its
    latent scale is the one ``guidance.tiny_vae_normalize`` says (METHOD §10): a clip is
    encoded by it and by the Wan folder's VAE on ``device``, and the configured hypothesis
    (true: its outputs are raw Wan 2.1 latents, normalised before the DiT; false: they are
    already normalised) must be the one with the smaller RMS difference from the Wan VAE's
    latents (:func:`chord.guidance.tiny_vae_check.compare_with_full_vae`). ``taew2_1`` has the
    same keys as ``lighttaew2_1`` but emits normalised latents: the keys cannot tell them
    apart. The clip: a still of the scene's reference render ``reference`` where given, else
    a deterministic moving pattern, at most 256 pixels wide."""
    if guidance.backend != "wan" or not any(m.use_tiny_vae for m in methods):
        return Check("tiny vae", NA, "method.use_tiny_vae is off or the teacher is not wan")
    from chord.guidance.tiny_vae import load_tiny_vae

    if not guidance.tiny_vae_path:
        return Check(
            "tiny vae",
            FAIL,
            "guidance.tiny_vae_path is not set",
            "point it at lighttaew2_1.pth",
        )
    try:
        tiny = load_tiny_vae(guidance.tiny_vae_path)
    except ValueError as exc:
        return Check(
            "tiny vae",
            FAIL,
            str(exc),
            "use the lighttaew2_1 weights (TAEHV for Wan 2.1 latents; layout in TAEHV.md)",
        )
    keys = f"{guidance.tiny_vae_path}: the lighttaew2_1 encoder keys"
    if not guidance.ckpt_dir or not (Path(guidance.ckpt_dir) / "vae").is_dir():
        return Check("tiny vae", PASS, f"{keys}; latent scale not checked: no Wan VAE")
    import torch

    from chord.guidance import tiny_vae_check, wan_folder

    try:
        vae = wan_folder.load_vae(guidance.ckpt_dir, device=device)
    except Exception as exc:  # the wan folder row names what is wrong with it
        return Check("tiny vae", PASS, f"{keys}; latent scale not checked: vae/ ({exc})")
    tiny.set_latent_stats(vae.config.latents_mean, vae.config.latents_std)
    tiny.to(device)
    if reference is not None and Path(reference).is_file():
        clip, name = tiny_vae_check.reference_clip(Path(reference)), f"a still of {reference}"
    else:
        w, h = tiny_vae_check.check_size(832, 480)
        clip = tiny_vae_check.synthetic_clip(tiny_vae_check.CHECK_FRAMES, h, w)
        name = "the test pattern"
    stats = tiny_vae_check.compare_with_full_vae(clip.to(device), tiny, vae)
    del vae, tiny
    if torch.device(device).type == "cuda":
        cuda_settings.empty_cache(device)
    status, detail, remedy = tiny_vae_check.scale_problem(
        stats, guidance.tiny_vae_normalize, guidance.tiny_vae_path, name
    )
    return Check("tiny vae", status, detail, remedy)


def check_memory(
    label: str, estimate: dict, gpu_mem: int | None, host_mem: int | None, *, gpu_fatal: bool
) -> list[Check]:
    """GPU memory and host RAM against the peak-memory model's ``estimate`` (one training);
    ``gpu_mem``/``host_mem`` in bytes, None where unknown."""
    rows = []
    need = estimate["reserved_bytes"] + peak_memory.CUDA_CONTEXT_GIB * GiB
    line = f"{label}: {peak_memory.describe(estimate)}"
    if gpu_mem is None:
        rows.append(Check("gpu memory", NA, f"needs a GPU (or gpu_mem_gb); {line}"))
    elif need > gpu_mem:
        rows.append(
            Check(
                "gpu memory",
                FAIL,
                f"{line}: {need / GiB:.1f} GiB with the CUDA context, over the "
                f"{gpu_mem / GiB:.1f} GiB GPU",
                "a leaner tier (the sheet's tier column), method.use_tiny_vae: true, or a lower "
                "size, frame_num or batch_size",
                fatal=gpu_fatal,
            )
        )
    else:
        rows.append(Check("gpu memory", PASS, f"{line}; fits {gpu_mem / GiB:.1f} GiB", fatal=False))
    host = estimate["host_bytes"]
    if host_mem is None:
        rows.append(Check("host ram", NA, f"host RAM unknown; the model needs {host / 1e9:.0f} GB"))
    elif host > host_mem:
        rows.append(
            Check(
                "host ram",
                FAIL,
                f"{label}: the model needs {host / GiB:.0f} GiB of host RAM (one expert "
                f"resident, mmgp staging where on), {host_mem / GiB:.0f} GiB available",
                "more host RAM (the tier's host_mem_gb, i.e. the job's mem_mb), or a tier "
                "without enable_mmgp",
            )
        )
    else:
        rows.append(
            Check(
                "host ram",
                PASS,
                f"{label}: {host / GiB:.0f} GiB of {host_mem / GiB:.0f} GiB",
            )
        )
    return rows


def check_allocator(env: Mapping[str, str] | None) -> Check:
    if env is None:
        return Check("allocator", NA, "not checked (no process environment given)")
    problem = cuda_settings.allocator_problem(env)
    if problem is not None:
        return Check(
            "allocator",
            FAIL,
            problem,
            f"unset {cuda_settings.ALLOC_CONF} (chord sets {cuda_settings.EXPANDABLE}) or add it",
            fatal=False,
        )
    return Check("allocator", PASS, f"{cuda_settings.ALLOC_CONF}={env[cuda_settings.ALLOC_CONF]}")


def check_disk(where: Path, need: int, what: str) -> Check:
    """Free space on ``where``'s file system (its nearest existing folder) for ``need`` bytes."""
    path = Path(where).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    free = shutil.disk_usage(path).free
    detail = f"{free / 1e9:.1f} GB free at {path}; {what} need ~{need / 1e9:.2f} GB"
    if free < need + DISK_MARGIN:
        return Check("disk", FAIL, detail, "free space, or point results at a larger disk")
    return Check("disk", PASS, detail)


# --- sizes of a run -----------------------------------------------------------------------------


def control_points(method, dynamic: Iterable[str]) -> int:
    """Control points of a scene's dynamic objects, both layers."""
    total = 0
    for name in dynamic:
        i = int(name.split("_")[1])
        total += method.cp_nums[i] if i < len(method.cp_nums) else method.cp_num
        if name in method.add_cp_objs:
            total += method.add_cp_num
    return total


def checkpoint_bytes(method, n_control_points: int) -> int:
    """All checkpoints of one training: per control point its centre, radius and rotation
    (10 floats) and its table of T frames (7 floats each), with Adam's two moments, at every
    save point, plus the surface sets."""
    per_cp = (10 + 7 * method.frame_num) * 4 * 3
    saves = len(range(method.save_interval, method.iterations + 1, method.save_interval)) + 4
    return saves * (per_cp * n_control_points + 3 * 4 * method.surface_target_num + 65536)


def export_bytes(method, gaussians: int, imported: bool) -> int:
    """The export's PLY sequence (one standard 3DGS PLY per frame) plus videos and the GLB."""
    degree = min(method.sh_degree, 3) if imported else 0
    per_gaussian = (17 + 3 * ((degree + 1) ** 2 - 1)) * 4
    return gaussians * per_gaussian * method.frame_num + 64 * MiB


def preflight(
    *,
    method,
    memory,
    guidance,
    device,
    render_backend: str,
    tier: str | None,
    host_mem_gb: float | None,
    gaussians: int,
    dynamic_gaussians: int,
    control_point_count: int,
    checkpoint_dir: Path,
    env: Mapping[str, str] | None,
) -> list[Check]:
    """The cheap checks of one training, at its start (no expert is loaded): the renderer,
    the Wan folder, the Tiny VAE file and its latent scale (a 5-frame test clip through it and
    the Wan VAE on ``device``), host RAM against the model, the allocator and the disk for its
    checkpoints. Raises :class:`PreflightError` on a fatal failure."""
    import torch

    cuda = torch.device(device).type == "cuda"
    wan = guidance.backend == "wan"
    checks = [check_cuda(needs_gpu=cuda)]
    if cuda:
        checks.append(check_renderer(render_backend, parity=False))
    checks += [check_wan_folder(guidance), check_tiny_vae(guidance, [method], device=device)]
    if wan:
        model = peak_memory.model_for(guidance.ckpt_dir)
        e = job_size.estimate(method, memory, None, gaussians, dynamic_gaussians, model)
        host = host_bytes(env)
        if host_mem_gb is not None:
            host = min(host or host_mem_gb * GiB, int(host_mem_gb * GiB))
        label = f"tier {tier}" if tier else "this training"
        # the GPU check is not fatal: an out-of-memory exit escalates to the next tier
        checks += check_memory(label, e, gpu_bytes(device) if cuda else None, host, gpu_fatal=False)
    checks.append(check_allocator(env))
    checks.append(
        check_disk(checkpoint_dir, checkpoint_bytes(method, control_point_count), "checkpoints")
    )
    for line in table(checks).splitlines():
        logger.info("preflight: %s", line)
    bad = failures(checks, fatal_only=True)
    if bad:
        raise PreflightError(
            "preflight failed: " + "; ".join(f"{c.name}: {c.detail} (fix: {c.remedy})" for c in bad)
        )
    for c in failures(checks):
        logger.warning("preflight: %s: %s (fix: %s)", c.name, c.detail, c.remedy)
    return checks

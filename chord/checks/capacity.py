"""The capacity rows: GPU memory and host RAM against the peak-memory model
(:func:`check_memory`), the CUDA allocator's setting (:func:`check_allocator`) and free disk
(:func:`check_disk`), with the sizes of a run they are measured against (control points,
checkpoints, the export)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from chord.checks.report import FAIL, NA, PASS, Check
from chord.resources import cuda_settings, peak_memory

GiB, MiB = peak_memory.GiB, peak_memory.MiB
#: headroom kept free on the results disk besides the estimate (bytes)
DISK_MARGIN = GiB


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

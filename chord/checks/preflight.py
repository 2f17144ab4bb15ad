"""The checks a training runs at its start (:func:`preflight`), and that ``chord doctor`` runs
on a GPU node before a long run, so that what would fail hours in (a missing gsplat build, an
incomplete Wan folder, a Tiny VAE file with other keys, too little host RAM for the experts, a
full disk) fails in the first minute instead.

Each check gives one row (:mod:`chord.checks.report`): pass, fail (with the remedy) or n/a
(with why: most often that it needs a GPU, or that the oracle teacher uses no weights). The
rows by concern: the GPU and gsplat's kernels (:mod:`chord.checks.gpu`), the teacher's files
(:mod:`chord.checks.teacher`), memory, allocator and disk (:mod:`chord.checks.capacity`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from chord.checks.capacity import check_allocator, check_disk, check_memory, checkpoint_bytes
from chord.checks.gpu import check_cuda, check_renderer
from chord.checks.report import Check, PreflightError, failures, table
from chord.checks.teacher import check_tiny_vae, check_wan_folder
from chord.resources import job_size, peak_memory
from chord.resources.machine import gpu_bytes, host_bytes

logger = logging.getLogger(__name__)

GiB = peak_memory.GiB


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
    contact_points: int = 0,
) -> list[Check]:
    """The cheap checks of one training, at its start (no expert is loaded): the renderer,
    the Wan folder, the Tiny VAE file and its latent scale (a 5-frame test clip through it and
    the Wan VAE on ``device``), host RAM against the model, the allocator and the disk for its
    checkpoints (``contact_points``: the contact loss's in the memory model,
    :func:`chord.resources.job_size.contact_points`). Raises :class:`PreflightError` on a fatal
    failure."""
    import torch

    cuda = torch.device(device).type == "cuda"
    wan = guidance.backend == "wan"
    checks = [check_cuda(needs_gpu=cuda)]
    if cuda:
        checks.append(check_renderer(render_backend, parity=False))
    checks += [check_wan_folder(guidance), check_tiny_vae(guidance, [method], device=device)]
    if wan:
        model = peak_memory.model_for(guidance.ckpt_dir)
        e = job_size.estimate(
            method, memory, None, gaussians, dynamic_gaussians, model, contact_points=contact_points
        )
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

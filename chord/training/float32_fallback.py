"""The float32 fallback of a :class:`~chord.training.trainer.Trainer` (METHOD §15): whether the
guidance may switch to float32 on this device and host, and the switch itself."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def problem(trainer) -> str | None:
    """Why the guidance cannot switch to float32 here, or None: mmgp keeps bf16, and the
    memory model (:mod:`chord.resources.peak_memory` with the expert in float32: twice its weights
    and activations) must fit the device's memory and the job's host RAM, where a switch
    of expert loads the next one in float32 (each figure unknown off CUDA: no limit)."""
    g = trainer.guidance
    if getattr(g, "mmgp", None) is not None:
        return "enable_mmgp keeps the experts in bf16"
    if trainer.gpu_memory_bytes is None and trainer.host_memory_bytes is None:
        return None
    from chord.resources import job_size, peak_memory

    GiB = peak_memory.GiB
    m = trainer.method
    dynamic = sum(
        trainer.scene.slices[n].stop - trainer.scene.slices[n].start for n in trainer.scene.dynamic
    )
    e = peak_memory.estimate(
        trainer.memory,
        width=trainer.width,
        height=trainer.height,
        frames=m.frame_num,
        batch=m.batch_size,
        gaussians=int(trainer.scene.means.shape[0]),
        dynamic_gaussians=dynamic,
        model=getattr(g, "model_shape", peak_memory.A14B),
        use_tiny_vae=getattr(g, "tiny_vae", None) is not None,
        expert_bytes=4,
        gpus=trainer.world_size,  # the host RAM of every rank on this node
        **job_size.trained_contact(m, trainer.scene, getattr(trainer, "contact_grid", None)),
    )
    weights = e["parts"]["dit_weights"] / GiB
    problems = []
    need = e["reserved_bytes"] + peak_memory.CUDA_CONTEXT_GIB * GiB
    if trainer.gpu_memory_bytes is not None and need > trainer.gpu_memory_bytes:
        problems.append(
            f"in float32 the memory model predicts {need / GiB:.1f} GiB "
            f"({e['phase']}; expert weights {weights:.1f} GiB) on a "
            f"{trainer.gpu_memory_bytes / GiB:.0f} GiB GPU"
        )
    host = e["host_bytes"]
    if trainer.host_memory_bytes is not None and host > trainer.host_memory_bytes:
        ranks = f"{trainer.world_size} ranks, each " if trainer.world_size > 1 else ""
        problems.append(
            f"in float32 the memory model needs {host / GiB:.1f} GiB of host RAM ({ranks}"
            f"the expert's float32 weights {weights:.1f} GiB + "
            f"{peak_memory.HOST_BASE_GIB:g} GiB for the process), but the job may use "
            f"{trainer.host_memory_bytes / GiB:.1f} GiB"
        )
    return "; ".join(problems) or None


def fall_back(trainer, why: str, otherwise: str) -> bool:
    """Switch the trainer's guidance to float32 (``why``: for the log) where :func:`problem`
    allows; else log the reason and ``otherwise`` (what the run does instead). Returns whether
    the guidance computes in float32 now."""
    if trainer.float32_fallback:
        return True
    reason = problem(trainer)
    if reason is None and not hasattr(trainer.guidance, "use_float32"):
        reason = f"the {type(trainer.guidance).__name__} guidance has no float32 mode"
    if reason is not None:
        logger.warning("float32 fallback not taken: %s; %s", reason, otherwise)
        return False
    trainer.guidance.use_float32()
    trainer.float32_fallback = True
    logger.warning("float32 fallback taken %s", why)
    return True

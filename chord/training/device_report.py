"""What a training reports of its device, for its log and progress lines only: which device it
runs on, the peak-memory model's estimate of the run (:mod:`chord.resources.peak_memory`) and
the peak GPU memory measured."""

from __future__ import annotations

import logging
import os

import torch

from chord.resources import job_size, peak_memory

logger = logging.getLogger(__name__)


def describe_device(device) -> str:
    """The device, with the GPU's name and the job's CUDA_VISIBLE_DEVICES on CUDA."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return str(dev)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    return f"{dev} ({torch.cuda.get_device_name(dev)}, CUDA_VISIBLE_DEVICES={visible})"


def gpu_peak_gb(device):
    """A function of the peak GPU memory allocated so far (GB) on CUDA, else None (the
    progress line's ``gpu_peak_gb``: :class:`chord.training.progress.Progress`)."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    return lambda: torch.cuda.max_memory_allocated() / 1e9


def log_memory_estimate(trainer, method, guidance, tier: str | None) -> dict | None:
    """Log the peak-memory model's estimate (that of the Wan teacher) of this training,
    ``method`` and ``trainer.memory`` being the effective ones; returns it (None for the
    oracle)."""
    if guidance.backend != "wan":
        return None
    scene = trainer.scene
    dynamic = sum(scene.slices[n].stop - scene.slices[n].start for n in scene.dynamic)
    model = peak_memory.model_for(guidance.ckpt_dir)
    contact = job_size.trained_contact(method, scene, getattr(trainer, "contact_grid", None))
    n = int(scene.means.shape[0])
    e = job_size.estimate(method, trainer.memory, None, n, dynamic, model, **contact)
    on = f" on tier {tier}" if tier else ""
    logger.info("memory model%s (experts: %s): %s", on, model.describe(), peak_memory.describe(e))
    return e


def log_measured_memory(device, predicted: dict | None, memory) -> None:
    """On CUDA, log the measured peak GPU memory of this process beside the model's
    (``predicted``: :func:`log_memory_estimate`'s)."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return
    gib = peak_memory.GiB
    line = (
        f"measured peak GPU memory: {torch.cuda.max_memory_allocated() / gib:.1f} GiB allocated, "
        f"{torch.cuda.max_memory_reserved() / gib:.1f} GiB reserved"
    )
    if predicted is not None:
        line += (
            f" (model: {predicted['gpu_bytes'] / gib:.1f} allocated, "
            f"{predicted['reserved_bytes'] / gib:.1f} reserved)"
        )
    if memory.log_run_time:  # its phase clock resets the allocated peak per phase
        line += "; allocated is the last phase's (per-phase peaks: the loss log's *_peak_mb)"
    logger.info(line)

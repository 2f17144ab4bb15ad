"""A :class:`~chord.training.trainer.Trainer`'s checkpoint (METHOD §17): what continues a run
after an iteration, restoring it, and the file it is saved in and loaded from."""

from __future__ import annotations

from pathlib import Path

import torch

from chord.core.errors import InputError
from chord.motion import state
from chord.training import float32_fallback, optimiser

CKPT_FORMAT = "chord-train/1"
# What each field of a checkpoint (:func:`contents`) and of a hand-off (:func:`handoff_contents`
# adds the rest) must be when read back (:func:`problems`): the readers index and compute with
# them, and the file may come from another version or a full disk. Python types; None allowed
# where the tuple holds type(None).
FIELDS = {
    "format": (str,), "iteration": (int,), "seed": (int,), "config_hash": (str,),
    "motion": (dict,), "motion_meta": (dict,), "optimizers": (dict,),
    "surface_voxel_size": (dict,), "float32_fallback": (bool,),
}  # fmt: skip
HANDOFF_FIELDS = {
    "size": (str,), "tier": (str, type(None)), "tiers": (list,), "render_backend": (str,),
    "device": (str,),
}  # fmt: skip


def save_checkpoint(path: Path, ckpt: dict) -> None:
    """Write ``ckpt`` to ``path`` atomically (a torch file, read weights-only)."""
    from chord.core.atomic_files import atomic_path

    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(ckpt, tmp)


def load_checkpoint(path: Path) -> dict:
    """A checkpoint or hand-off file written by :func:`save_checkpoint`; an
    :class:`~chord.core.errors.InputError` naming ``path`` when it is not one."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise InputError(f"{path}: not a readable training checkpoint ({exc})") from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != CKPT_FORMAT:
        raise InputError(f"{path}: not a {CKPT_FORMAT} checkpoint")
    if found := problems(ckpt):  # written by another version, or cut short
        raise InputError(f"{path}: a damaged {CKPT_FORMAT} checkpoint: {'; '.join(found)}")
    return ckpt


def contents(trainer, it: int, config_hash: str) -> dict:
    """Everything needed to continue after iteration ``it`` (weights-only loadable)."""
    tensors, meta = state.to_dict(trainer.scene)
    return {
        "format": CKPT_FORMAT,
        "iteration": it,
        "seed": trainer.seed,
        "config_hash": config_hash,
        "motion": tensors,
        "motion_meta": meta,
        "optimizers": {n: o.state_dict() for n, o in trainer.optimizers.items()},
        "surface_voxel_size": trainer.surface_voxel_size,
        # the guidance fell back to float32: a resumed run computes as this one did
        "float32_fallback": trainer.float32_fallback,
    }


def problems(ckpt: dict) -> list[str]:
    """What is wrong with a loaded checkpoint's fields (:data:`FIELDS`, and
    :data:`HANDOFF_FIELDS`): no ``iteration`` (every reader reads it), or a field of another
    type, each named. Other fields may be absent (older files lack ``float32_fallback``; a
    reader of a part of the state writes that part)."""
    found = [] if "iteration" in ckpt else ["no iteration"]
    for name, kinds in {**FIELDS, **HANDOFF_FIELDS}.items():
        if name not in ckpt:
            continue
        value = ckpt[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            want = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            found.append(f"{name} is {type(value).__name__}, not {want}")
    return found


def restore(trainer, ckpt: dict) -> int:
    """Restore :func:`contents` into ``trainer``; returns the next iteration to run. A
    checkpoint written after the float32 fallback switches the guidance to float32 again
    (before the first step: a resumed or requeued run, the fine stage after the coarse); one
    without the field (older) leaves the guidance as it is."""
    state.restore(trainer.scene, ckpt["motion"], ckpt["motion_meta"])
    for name, obj in trainer.scene.dynamic.items():
        opt = optimiser.make_optimizer(obj.param_groups(), trainer.method, ckpt["iteration"])
        opt.load_state_dict(ckpt["optimizers"][name])
        trainer.optimizers[name] = opt
    trainer.arap_connectivity.clear()
    trainer.seed = ckpt["seed"]
    if ckpt.get("float32_fallback", False):
        float32_fallback.fall_back(
            trainer,
            f"again: the checkpoint of iteration {ckpt['iteration']} was computed in float32",
            "continuing at the guidance's precision",
        )
    return ckpt["iteration"] + 1


def handoff_contents(
    trainer, it: int, config_hash: str, *, size: str, tier: str | None, before, device
) -> dict:
    """A stage's hand-off state (coarse.pt, fine.pt) after its last iteration ``it``: its
    checkpoint with the size trained at (a lowres tier changes it), the ``tier``, every stage's
    tier, coarse first (``before``: the hand-off it continued, or None; the result's provenance
    in metrics.tsv), the render backend and the ``device``."""
    return {
        **contents(trainer, it, config_hash),
        "size": size,
        "tier": tier,
        "tiers": [*(before.get("tiers", []) if before else []), tier],
        "render_backend": trainer.backend,
        "device": str(device),
    }

"""The motion state (METHOD §19): plain tensors plus JSON-able metadata, which every training
checkpoint and hand-off state holds (``chord.training.checkpoint.save_checkpoint``: a torch file
read back with ``weights_only``, so loading executes no code). It holds everything needed to
rebuild and continue the motion of a scene on top of its rest Gaussians: per dynamic object the
layers' centres, radii, rotations and tables (with their per-frame flags), the surface set, the
ARAP sample count and the rotation composition."""

from __future__ import annotations

import torch

from chord.core.errors import InputError
from chord.motion.model import MotionScene

FORMAT = "chord-motion/1"


def _layer_tensors(prefix: str, layer) -> dict:
    return {
        f"{prefix}.centres": layer.centres,
        f"{prefix}.cp_radius": layer.cp_radius,
        f"{prefix}.cp_rotation": layer.cp_rotation,
        f"{prefix}.cp_deform": layer.cp_deform,
    }


def to_dict(scene: MotionScene, **extra) -> tuple[dict, dict]:
    """(tensors, metadata) of a scene's motion; ``extra`` goes into the metadata."""
    tensors, objects = {}, {}
    for name, obj in scene.dynamic.items():
        tensors.update(_layer_tensors(f"{name}.layer1", obj.layer1))
        tensors[f"{name}.surface"] = obj.surface
        info = {
            "n_points": int(obj.rest_means.shape[0]),
            "frame_num": obj.frame_num,
            "n_cp_num": obj.n_cp_num,
            "arap_sample_num": obj.arap_sample_num,
            "mult_rot_way": obj.mult_rot_way,
            "detach_first": obj.detach_first,
            "layer1_per_frame": obj.layer1.per_frame,
            "layer2": obj.layer2 is not None,
        }
        if obj.layer2 is not None:
            tensors.update(_layer_tensors(f"{name}.layer2", obj.layer2))
            info["layer2_per_frame"] = obj.layer2.per_frame
        objects[name] = info
    meta = {"format": FORMAT, "objects": objects, "names": scene.names, **extra}
    return {k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}, meta


@torch.no_grad()
def restore(scene: MotionScene, tensors: dict, meta: dict, *, where: str = "state") -> None:
    """Load a state into a scene built from the same rest Gaussians (in place)."""
    if set(meta["objects"]) != set(scene.dynamic):
        raise InputError(
            f"{where}: dynamic objects {sorted(meta['objects'])} do not match "
            f"the scene's {sorted(scene.dynamic)}"
        )
    for name, info in meta["objects"].items():
        obj = scene.dynamic[name]
        if info["n_points"] != obj.rest_means.shape[0] or info["frame_num"] != obj.frame_num:
            raise InputError(
                f"{where}: {name} was saved for {info['n_points']} Gaussians and "
                f"{info['frame_num']} frames, the scene has "
                f"{obj.rest_means.shape[0]} and {obj.frame_num}"
            )
        t = {k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(name + ".")}
        if info["layer2"] and obj.layer2 is None:
            obj.add_second_layer(
                t["layer2.centres"],
                t["surface"],
                mult_rot_way=info["mult_rot_way"],
                detach_first=info["detach_first"],
            )
        obj.surface = t["surface"].to(obj.rest_means).clone()
        obj.arap_sample_num = info["arap_sample_num"]
        obj._nbr.clear()
        layers = [("layer1", obj.layer1)] + ([("layer2", obj.layer2)] if info["layer2"] else [])
        for key, layer in layers:
            if not torch.equal(layer.centres.cpu(), t[f"{key}.centres"].to(layer.centres.dtype)):
                layer.centres = t[f"{key}.centres"].to(layer.centres)
                obj._nbr.clear()
            for p in ("cp_radius", "cp_rotation", "cp_deform"):
                getattr(layer, p).copy_(t[f"{key}.{p}"])
            layer.per_frame = bool(info.get(f"{key}_per_frame", False))

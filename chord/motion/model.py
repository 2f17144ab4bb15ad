"""Dynamic objects (one or two control-point layers over rest Gaussians) and the scene
container that produces per-frame Gaussians for the renderer (METHOD §5, §7)."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch import Tensor, nn

from chord.core import quaternion as quat
from chord.motion import control_points
from chord.motion.layer import ControlPointLayer

logger = logging.getLogger(__name__)

ROT_WAYS = (0, 1, 2)


def _frames(frames, device) -> Tensor:
    f = torch.as_tensor(frames, dtype=torch.long, device=device).reshape(-1)
    return f


class DynamicObject(nn.Module):
    """Rest Gaussians of one dynamic object with its control-point layers.

    Buffers: rest means [N, 3], rest quats [N, 4], surface voxels [V, 3] (ARAP, ground).
    ``layer1`` always exists; ``layer2`` after :meth:`add_second_layer`.
    """

    def __init__(
        self,
        name: str,
        rest_means: Tensor,
        rest_quats: Tensor,
        centres: Tensor,
        surface: Tensor,
        *,
        frame_num: int,
        n_cp_num: int = 3,
        arap_sample_num: int = 1024,
    ):
        super().__init__()
        self.name = name
        self.register_buffer("rest_means", rest_means.clone())
        self.register_buffer("rest_quats", rest_quats.clone())
        self.register_buffer("surface", surface.clone())
        self.layer1 = ControlPointLayer(centres, frame_num, n_cp_num)
        self.layer2: ControlPointLayer | None = None
        self.frame_num = frame_num
        self.n_cp_num = n_cp_num
        self.arap_sample_num = arap_sample_num
        self.mult_rot_way = 0
        self.detach_first = False
        self._nbr: dict[str, tuple[Tensor, Tensor | None]] = {}

    # -- neighbours ------------------------------------------------------------------------
    def _points(self, key: str) -> Tensor:
        return {"gaussians": self.rest_means, "surface": self.surface}[key]

    def neighbours(self, key: str) -> tuple[Tensor, Tensor | None]:
        """Cached K-nearest-centre indices of a named point set for both layers."""
        if key not in self._nbr:
            pts = self._points(key)
            idx2 = None if self.layer2 is None else self.layer2.neighbours(pts)
            self._nbr[key] = (self.layer1.neighbours(pts), idx2)
        return self._nbr[key]

    # -- deformation -----------------------------------------------------------------------
    def deform(
        self,
        frames,
        points: Tensor | str = "gaussians",
        *,
        detach_weights: bool = False,
        with_rotations: bool = True,
    ):
        """Positions [F, N, 3] (and rotations [F, N, 4]) of rest points at ``frames``.

        ``points``: "gaussians", "surface" or a tensor [N, 3] of other rest points (e.g. mesh
        vertices); rotations are only defined for the Gaussians. Frame 0 is pinned: it returns
        the rest values exactly, with no gradient. ``detach_weights`` gives sg(w).
        """
        if isinstance(points, str):
            key, x = points, self._points(points)
            idx1, idx2 = self.neighbours(points)
        else:
            key, x = None, points
            idx1 = self.layer1.neighbours(x)
            idx2 = None if self.layer2 is None else self.layer2.neighbours(x)
        want_rot = with_rotations and key == "gaussians"
        frames = _frames(frames, x.device)
        moving = frames[frames != 0]
        pos = x[None].expand(len(frames), -1, -1).clone()
        rot = self.rest_quats[None].expand(len(frames), -1, -1).clone() if want_rot else None
        if len(moving) == 0:
            return pos, rot
        w1 = self.layer1.weights(x, idx1, detach=detach_weights)
        dx1, b1 = self.layer1.blend(x, idx1, w1, moving)
        if self.layer2 is not None and self.detach_first:
            dx1, b1 = dx1.detach(), b1.detach()
        dx = dx1
        if self.layer2 is not None:
            w2 = self.layer2.weights(x, idx2, detach=detach_weights)
            dx2, b2 = self.layer2.blend(x, idx2, w2, moving)
            dx = dx1 + dx2
        mask = frames != 0
        pos = pos.masked_scatter(mask[:, None, None].expand_as(pos), x[None] + dx)
        if want_rot:
            qg = quat.normalize(self.rest_quats)[None]  # [1, N, 4]
            if self.layer2 is None:
                q = quat.multiply(b1, qg)
            elif self.mult_rot_way == 0:
                q = quat.multiply(quat.multiply(b2, b1), qg)
            elif self.mult_rot_way == 1:
                q = quat.multiply(b1 + b2, qg)
            else:
                q = quat.multiply(quat.multiply(b1, b2), qg)
            rot = rot.masked_scatter(mask[:, None, None].expand_as(rot), quat.normalize(q))
        return pos, rot

    # -- second layer (METHOD §7) ----------------------------------------------------------
    def add_second_layer(
        self, centres: Tensor, surface: Tensor, *, mult_rot_way: int = 0, detach_first: bool = False
    ) -> None:
        """Add an identity second layer on ``centres``; ``surface`` replaces the ARAP/ground
        set, the ARAP sample count scales by |new|/|old| (floored) and caches are cleared."""
        if self.layer2 is not None:
            raise ValueError(f"{self.name}: already has a second control-point layer")
        if mult_rot_way not in ROT_WAYS:
            raise ValueError(f"mult_rot_way: {mult_rot_way} is not one of {ROT_WAYS}")
        self.layer2 = ControlPointLayer(centres.to(self.rest_means), self.frame_num, self.n_cp_num)
        old = max(1, self.surface.shape[0])
        self.arap_sample_num = math.floor(self.arap_sample_num * surface.shape[0] / old)
        self.surface = surface.to(self.rest_means).clone()
        self.mult_rot_way = mult_rot_way
        self.detach_first = detach_first
        self._nbr.clear()

    def param_groups(self) -> dict[str, nn.Parameter]:
        """Optimiser groups by METHOD §17's names."""
        groups = {
            "cp_deform": self.layer1.cp_deform,
            "cp_radius": self.layer1.cp_radius,
            "cp_rotation": self.layer1.cp_rotation,
        }
        if self.layer2 is not None:
            groups.update(
                c_cp_deform=self.layer2.cp_deform,
                c_cp_radius=self.layer2.cp_radius,
                c_cp_rotation=self.layer2.cp_rotation,
            )
        return groups


class MotionScene(nn.Module):
    """All objects of a scene in id order: static ones repeated in every frame, dynamic ones
    deformed; avoided objects are not part of it. Appearance (scales, opacities, SH) is
    constant; only the dynamic objects' motion parameters train."""

    def __init__(self, names: list[str], splats: list[dict], dynamic: dict[str, DynamicObject]):
        super().__init__()
        if len(names) != len(splats):
            raise ValueError("names and splats differ in length")
        self.names = list(names)
        self.dynamic = nn.ModuleDict(dynamic)
        degree = max(s["sh_degree"] for s in splats)
        K = (degree + 1) ** 2
        sh = []
        for s in splats:  # pad lower SH degrees with zeros
            pad = s["sh"].new_zeros(s["sh"].shape[0], K, 3)
            pad[:, : s["sh"].shape[1]] = s["sh"]
            sh.append(pad)
        self.sh_degree = degree
        self.register_buffer("means", torch.cat([s["means"] for s in splats]))
        self.register_buffer("quats", torch.cat([s["quats"] for s in splats]))
        self.register_buffer("scales", torch.cat([s["scales"] for s in splats]))
        self.register_buffer("opacities", torch.cat([s["opacities"] for s in splats]))
        self.register_buffer("sh", torch.cat(sh))
        counts = [s["means"].shape[0] for s in splats]
        starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        self.slices = {n: slice(starts[i], starts[i + 1]) for i, n in enumerate(names)}

    def frame_gaussians(
        self, frames, *, detach_weights: bool = False, objects: list[str] | None = None
    ) -> dict:
        """Per-frame render inputs: means [F, N, 3] and quats [F, N, 4] (static objects
        repeated, dynamic ones deformed), scales [N, 3], opacities [N], sh [N, K, 3] and
        sh_degree, for ``objects`` (default: all, in id order)."""
        frames = _frames(frames, self.means.device)
        F = len(frames)
        names = objects or self.names
        means, quats, keep = [], [], []
        for name in names:
            sl = self.slices[name]
            if name in self.dynamic:
                m, q = self.dynamic[name].deform(frames, detach_weights=detach_weights)
            else:
                m = self.means[sl][None].expand(F, -1, -1)
                q = self.quats[sl][None].expand(F, -1, -1)
            means.append(m)
            quats.append(q)
            keep.append(torch.arange(sl.start, sl.stop, device=self.means.device))
        idx = torch.cat(keep)
        return {
            "means": torch.cat(means, 1),
            "quats": torch.cat(quats, 1),
            "scales": self.scales[idx],
            "opacities": self.opacities[idx],
            "sh": self.sh[idx],
            "sh_degree": self.sh_degree,
        }


def build_scene(
    doc: dict, gaussians: dict, voxels: dict, method, *, dtype=torch.float32, device="cpu"
) -> MotionScene:
    """A :class:`MotionScene` from the stage outputs: scene.json's mapping ``doc``,
    ``gaussians`` {name: GaussianSet} for every non-avoided object, and ``voxels`` {name:
    mapping with "control_points" and "surface"} for every dynamic object."""
    from chord.render.rasterizer import splat_tensors

    names, splats, dynamic = [], [], {}
    for obj in doc["objects"]:
        name, role = obj["name"], obj["role"]
        if role == "avoided":
            continue
        if name not in gaussians:
            raise ValueError(f"{doc['scene']}: no Gaussians for {name}")
        sp = splat_tensors(gaussians[name], dtype=dtype, device=device)
        names.append(name)
        splats.append(sp)
        if role == "dynamic":
            if name not in voxels:
                raise ValueError(f"{doc['scene']}: no voxels for dynamic object {name}")
            t = lambda a: torch.as_tensor(np.asarray(a), dtype=dtype, device=device)  # noqa: E731
            dynamic[name] = DynamicObject(
                name,
                sp["means"],
                sp["quats"],
                t(voxels[name]["control_points"]),
                t(voxels[name]["surface"]),
                frame_num=method.frame_num,
                n_cp_num=method.n_cp_num,
                arap_sample_num=method.arap_sample_num,
            )
    return MotionScene(names, splats, dynamic)


def plan_second_layer(
    mesh, gaussian_means: np.ndarray, *, mem_init_voxel_size: float, first_layer_count: int, method
) -> tuple[np.ndarray, np.ndarray, float]:
    """METHOD §7 steps 1–3: second-layer centres [M2, 3] and the new surface set [V2, 3].

    Solid set at v₂ = mem_init_voxel_size/add_cp_voxel_scale with add_cp_num centres by FPS +
    k-means; a surface set bisected from v₂ with target ⌊surface_target_num·add_cp_num/M₁⌋;
    centres pruned against the Gaussians and the new set. Returns (centres, surface, v*).
    """
    from chord.motion import voxels as vx

    v2 = mem_init_voxel_size / method.add_cp_voxel_scale
    solid = vx.solid_voxels(mesh, v2)
    centres = control_points.place_control_points(solid, method.add_cp_num)
    target = method.surface_target_num * method.add_cp_num // first_layer_count
    surface, v_star = vx.bisect_surface_voxel_size(mesh, v2, target, br_range=method.br_range)
    keep = control_points.prune_control_points(centres, gaussian_means, surface, method.n_cp_num)
    control_points.check_control_point_count(int(keep.sum()), obj="second layer")
    logger.info(
        "second layer: %d/%d centres at v2=%.5f, %d surface voxels (target %d)",
        int(keep.sum()),
        len(keep),
        v2,
        len(surface),
        target,
    )
    return centres[keep], surface, v_star

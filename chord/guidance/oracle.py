"""The oracle teacher (DESIGN §4): an exact rectified-flow velocity toward the latent of a
target video rendered, from the same camera, with the scene's scripted ground-truth motion.

With a point mass at z*, the ideal velocity is v(z_t, t) = (z_t − z*)/t, so the RF-SDS
gradient w·(v − (ε − z)) becomes w·(z − z*)/t: distillation must recover the scripted motion.
Its "encoder" is a fixed average pooling of the frames (cheap on a CPU); it needs no text.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.spatial.transform import Rotation
from torch import Tensor

from chord.core import quaternion as quat
from chord.core.errors import InputError
from chord.motion import scripted
from chord.render.views import render_video

logger = logging.getLogger(__name__)

JACOBIAN_STEP = 1e-4  # world units, for the local rotation of the scripted deformation


def _rotation_quats(jac: np.ndarray) -> np.ndarray:
    """Nearest rotations of Jacobians [N, 3, 3] (scipy's orthogonal approximation) as wxyz
    quaternions [N, 4]."""
    xyzw = Rotation.from_matrix(jac).as_quat()
    return np.concatenate([xyzw[:, 3:], xyzw[:, :3]], axis=1)


def scripted_gaussians(doc: dict, rest: dict[str, dict], motion: dict, frame_num: int):
    """Target per-frame Gaussians of a scene under its scripted motion (no gradient).

    ``doc``: scene.json mapping (normalisation), ``rest``: {name: splat_tensors} in the
    scene's object order, ``motion``: :func:`chord.motion.scripted.load_motion`. Positions follow
    ``apply_motion`` in world space; each Gaussian turns by the rotation part (polar
    decomposition) of the deformation's local Jacobian. Returns means [T, N, 3] and
    quats [T, N, 4] concatenated in ``rest`` order.
    """
    if motion["frame_num"] != frame_num:
        raise InputError(
            f"motion.json has {motion['frame_num']} frames but frame_num is "
            f"{frame_num}; regenerate it (chord demo-scenes --frame-num "
            f"{frame_num}) or set frame_num to match"
        )
    c = np.asarray(doc["normalisation"]["centre"], dtype=np.float64)
    s = float(doc["normalisation"]["scale"])
    means, quats = [], []
    for name, sp in rest.items():
        m0 = sp["means"].detach().double().numpy()
        q0 = sp["quats"].detach().double()
        spec = motion["objects"].get(name)
        if spec is None:  # static or unscripted: at rest in every frame
            means.append(torch.as_tensor(m0)[None].expand(frame_num, -1, -1))
            quats.append(q0[None].expand(frame_num, -1, -1))
            continue
        world = m0 / s + c
        fm, fq = [], []
        eye = np.eye(3) * JACOBIAN_STEP
        for t in range(frame_num):
            moved = scripted.apply_motion(world, spec, t)
            jac = np.stack(
                [
                    (scripted.apply_motion(world + eye[a], spec, t) - moved) / JACOBIAN_STEP
                    for a in range(3)
                ],
                axis=2,
            )  # [N, 3, 3], column a = ∂p/∂x_a
            fm.append(torch.as_tensor((moved - c) * s))
            r = torch.as_tensor(_rotation_quats(jac))
            fq.append(quat.normalize(quat.multiply(r, quat.normalize(q0))) if t else q0)
        means.append(torch.stack(fm))
        quats.append(torch.stack(fq))
    return torch.cat(means, 1), torch.cat(quats, 1)


class OracleGuidance:
    """Exact teacher toward renders of the scripted motion; same interface as Wan.

    ``target``: per-frame Gaussians (``scripted_gaussians``) plus the constant appearance
    (scales [N, 3], opacities [N], sh [N, K, 3], sh_degree); ``pool``: the encoder's spatial
    average-pooling factor; ``gain``: a constant factor on the latent, so on the SDS gradient
    squared: the teacher's strength against the regularisers, which a real model sets through
    its latent normalisation.
    """

    def __init__(
        self,
        target: dict,
        *,
        width: int,
        height: int,
        pool: int = 4,
        gain: float = 1.0,
        backend: str = "auto",
    ):
        if width % pool or height % pool:
            raise InputError(f"oracle pool {pool} must divide the size {width}x{height}")
        if not gain > 0:
            raise InputError(f"oracle gain must be positive, got {gain}")
        self.target, self.width, self.height, self.pool = target, width, height, pool
        self.gain, self.backend = float(gain), backend

    def encode_video(self, video: Tensor, *, checkpoint: bool = False) -> Tensor:
        """z [3, T, H/p, W/p] of a video [T, 3, H, W]: average pooling times the gain,
        differentiable (``checkpoint`` is accepted for the interface: a pool keeps no graph
        worth checkpointing)."""
        z = F.avg_pool2d(video, self.pool).transpose(0, 1)
        return z * self.gain if self.gain != 1.0 else z

    @torch.no_grad()
    def render_target(self, viewmat: Tensor, K: Tensor, background: Tensor) -> Tensor:
        """The scripted-motion video [T, 3, H, W] from one camera and background."""
        return render_video(
            self.target, viewmat, K, self.width, self.height, background, backend=self.backend
        )

    @torch.no_grad()
    def condition(self, video: Tensor, *, viewmat: Tensor, K: Tensor, background: Tensor) -> Tensor:
        """The target latent z* of this video's camera and background."""
        return self.encode_video(self.render_target(viewmat, K, background))

    @torch.no_grad()
    def velocity(
        self, z_t: Tensor, t: float, conds: list[Tensor], text=None, cfg_scale: float = 1.0
    ) -> Tensor:
        """v(z_t, t) = (z_t − z*)/t [B, ...] (text and CFG do not apply to the oracle)."""
        return (z_t - torch.stack(conds).to(z_t)) / t

    def unload(self) -> None:
        """Nothing is resident."""


def for_scene(
    doc: dict,
    gsets: dict,
    data_dir: Path,
    method,
    guidance,
    width,
    height,
    device=None,
    backend: str = "auto",
):
    """The oracle of a scene (its stage files' ``doc`` and Gaussian sets ``gsets``): the
    target video of the scripted ``motion.json`` in ``data_dir`` at the SDS size."""
    from chord.render.rasterizer import splat_tensors

    path = Path(data_dir) / "motion.json"
    if not path.is_file():
        raise InputError(
            f"{path}: missing; the oracle guidance distils a scene's scripted "
            "motion.json (use guidance.backend: wan for other scenes)"
        )
    motion = scripted.load_motion(path)
    rest = {n: splat_tensors(g) for n, g in gsets.items()}
    means, quats = scripted_gaussians(doc, rest, motion, method.frame_num)
    cat = lambda k: torch.cat([rest[n][k] for n in rest])  # noqa: E731
    degree = max(g.sh_degree for g in gsets.values())
    sh = torch.cat(
        [
            torch.nn.functional.pad(
                rest[n]["sh"], (0, 0, 0, (degree + 1) ** 2 - rest[n]["sh"].shape[1])
            )
            for n in rest
        ]
    )
    target = {
        "means": means.float(),
        "quats": quats.float(),
        "scales": cat("scales"),
        "opacities": cat("opacities"),
        "sh": sh,
        "sh_degree": degree,
    }
    if device is not None:
        target = {k: v.to(device) if torch.is_tensor(v) else v for k, v in target.items()}
    return OracleGuidance(
        target,
        width=width,
        height=height,
        pool=guidance.oracle_pool,
        gain=guidance.oracle_gain,
        backend=backend,
    )

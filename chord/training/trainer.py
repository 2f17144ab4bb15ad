"""The Trainer (METHOD §15–§18): one iteration of the optimisation, with its regularisers,
RF-SDS in every memory mode, the table operations at their iterations, Adam, the ranks'
collectives; its checkpoint contents are :mod:`chord.training.checkpoint`, its float32 fallback
:mod:`chord.training.float32_fallback`, the run loop around it :mod:`chord.training.run_loop`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from chord.guidance import rfsds
from chord.motion import contact, fenwick
from chord.motion import regularisers as losses
from chord.motion.model import MotionScene, plan_second_layer
from chord.render import cameras
from chord.render.backend import resolve_backend
from chord.render.views import render_video
from chord.resources import cuda_settings
from chord.training import optimiser, rng
from chord.training.distributed import Group
from chord.training.phase_clock import PhaseClock

logger = logging.getLogger(__name__)


@dataclass
class Trainer:
    """Everything one optimisation run needs; :meth:`step` runs one iteration."""

    scene: MotionScene
    guidance: object
    text: dict | None
    method: object
    width: int
    height: int
    target: tuple = (0.0, 0.0, 0.0)
    memory: object = None  # chord.config.settings.MemoryConfig (METHOD §15; None: the defaults)
    seed: int = 0
    group: Group = field(default_factory=Group)  # this rank's process group (METHOD §18)
    ground_level: float = 0.0
    meshes: dict = field(default_factory=dict)  # obj -> trimesh (for the second layer)
    surface_voxel_size: dict = field(default_factory=dict)  # obj -> mem_init_voxel_size
    backend: str = "auto"  # render_backend: resolved once, for this device (recorded in state)
    gpu_memory_bytes: int | None = None  # the device's memory (read on CUDA when None)
    # the job's host RAM limit (chord.resources.machine.host_bytes, read on CUDA when None): where
    # the
    # float32 fallback's experts are loaded; a CPU's experts are float32 already
    host_memory_bytes: int | None = None
    # the static objects' signed distance (chord.motion.contact.DistanceGrid), built once per run
    # where lambda_contact or lambda_support > 0 (chord.training.scene_trainer.build), and the
    # points of each dynamic object it is read at (its mesh's surface samples, rest pose [n, 3]);
    # None / {}: no contact terms
    contact_grid: object = None
    contact_points: dict = field(default_factory=dict)

    def __post_init__(self):
        m = self.method
        if self.memory is None:
            from chord.config import settings

            self.memory = settings.memory_from_mapping({})
        # the memory mode is chosen once (METHOD §15): both give the same gradients
        self.sds = self.sds_split if self.memory.split_sds_backward else self.sds_joint
        self.device = self.scene.means.device  # the scene's: cameras and frames follow it
        self.backend = resolve_backend(self.backend, self.device)
        if self.gpu_memory_bytes is None and self.device.type == "cuda":
            self.gpu_memory_bytes = torch.cuda.get_device_properties(self.device).total_memory
        if self.host_memory_bytes is None and self.device.type == "cuda":
            from chord.resources import machine

            self.host_memory_bytes = machine.host_bytes()
        self.frames = torch.arange(m.frame_num, device=self.device)
        self.K = cameras.intrinsics(self.width, self.height, m.fovy).to(self.device)
        self.sds_scale, self.temporal_scale = rfsds.resolution_scales(self.width, self.height)
        self.optimizers = {
            name: optimiser.make_optimizer(obj.param_groups(), m, 1)
            for name, obj in self.scene.dynamic.items()
        }
        self.arap_connectivity = {}
        self.contact_rest = {}  # obj -> the signed distance of its contact points at rest [n]
        if self.contact_grid is not None:
            self.contact_grid = self.contact_grid.to(self.device)
        self.contact_points = {
            k: torch.as_tensor(v, dtype=self.scene.means.dtype, device=self.device)
            for k, v in self.contact_points.items()
        }
        self.nonfinite = 0
        self.float32_fallback = False  # the guidance computes in float32 (checkpointed)
        self.teacher_nan = 0  # NaN entries of the teacher's velocities this iteration
        self.teacher_nonfinite = 0  # NaN or ±inf entries of them
        if self.group.distributed:
            if self.group.device != self.device:
                raise ValueError(
                    f"the scene is on {self.device}, its process group on {self.group.device}: "
                    "each rank trains on its own device (cuda:LOCAL_RANK under torchrun)"
                )
            self.sync_from_rank0()

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @torch.no_grad()
    def sync_from_rank0(self) -> None:
        """METHOD §18: rank 0's control points, surface sets and parameters on every rank."""
        for name, obj in self.scene.dynamic.items():
            for layer in (obj.layer1, obj.layer2):
                if layer is None:
                    continue
                for t in (layer.centres, layer.cp_radius, layer.cp_rotation, layer.cp_deform):
                    self.group.broadcast(t.data, f"{name} control points")
            self.group.broadcast(obj.surface, f"{name} surface")
            obj._nbr.clear()

    # -- rendering -------------------------------------------------------------------------
    def render(self, viewmat: Tensor, background: Tensor, frames: Tensor) -> Tensor:
        """Video [F, 3, H, W] of ``frames`` from one camera (live skinning weights unless
        ``detach_radius``)."""
        g = self.scene.frame_gaussians(frames, detach_weights=self.method.detach_radius)
        return render_video(
            g, viewmat, self.K, self.width, self.height, background, backend=self.backend
        )

    def _chunks(self):
        T = self.method.frame_num
        c = self.memory.split_render_chunk_size
        c = T if c == -1 else c
        return [self.frames[s : s + c] for s in range(0, T, c)]

    def backprop_video(self, viewmat, background, loss_of_video, video=None) -> None:
        """Render with grad and backpropagate ``loss_of_video(video)``; with
        ``split_render_backward``: render without grad into a leaf (or take ``video``, the same
        render made earlier without grad), backprop the loss to it, then re-render chunk by
        chunk and backpropagate its gradient (METHOD §15)."""
        if not self.memory.split_render_backward:
            loss_of_video(self.render(viewmat, background, self.frames)).backward()
            return
        if video is None:
            with torch.no_grad():
                video = self.render(viewmat, background, self.frames)
        leaf = video.detach().to(self.device).requires_grad_(True)
        loss_of_video(leaf).backward()
        grad = leaf.grad
        del leaf, video
        cuda_settings.empty_cache(self.device)  # the encoder graph's blocks, before the re-render
        for chunk in self._chunks():
            part = self.render(viewmat, background, chunk)
            if part.requires_grad:  # frame 0 alone is pinned: nothing to backpropagate
                part.backward(grad[chunk])
            del part
            cuda_settings.empty_cache(self.device)  # each chunk's render graph (METHOD §15)

    # -- losses ----------------------------------------------------------------------------
    def regularisers(self, it: int, cams: dict) -> dict[str, float]:
        """METHOD §16: ground, temporal and ARAP losses, and the contact and support losses
        (ours, :mod:`chord.motion.contact`, on ``contact_landmarks``), one backward; returns the
        values."""
        m, B = self.method, len(cams["viewmats"])
        total = 0.0
        out = {"ground": 0.0, "temporal": 0.0, "arap": 0.0, "contact": 0.0, "support": 0.0}
        lam_t = losses.time_weight(
            it,
            lambda_dis_time=m.lambda_dis_time,
            landmarks=m.time_loss_landmarks,
            steps=m.landmark_steps,
            n_iters=m.iterations,
        )
        lam_a = losses.arap_weight(
            it,
            lambda_arap=m.lambda_arap,
            landmarks=m.arap_landmarks,
            steps=m.landmark_steps,
            n_iters=m.iterations,
        )
        lam_c, lam_s = (
            lam * losses.landmark_value(it, m.landmark_steps, m.contact_landmarks, m.iterations)
            if lam > 0 and self.contact_grid is not None
            else 0.0
            for lam in (m.lambda_contact, m.lambda_support)
        )
        for name, obj in self.scene.dynamic.items():
            if m.lambda_ground > 0 and name in m.gl_objects:
                X, _ = obj.deform(self.frames, points="surface", detach_weights=True)
                loss = m.lambda_ground * losses.ground_loss(X[..., 1], self.ground_level)
                total = total + loss
                out["ground"] += float(loss.detach())
            if lam_t > 0:
                means, quats = obj.deform(self.frames, detach_weights=True)
                sl = self.scene.slices[name]
                tl = losses.temporal_loss(
                    means,
                    quats,
                    self.scene.scales[sl],
                    self.scene.opacities[sl],
                    cams["viewmats"].to(means.dtype),
                    self.K.to(means.dtype),
                    self.width,
                    self.height,
                    backend=self.backend,
                )
                loss = tl * lam_t * self.temporal_scale / B
                total = total + loss
                out["temporal"] += float(loss.detach())
            if lam_a > 0:
                if name not in self.arap_connectivity:
                    self.arap_connectivity[name] = losses.arap_connectivity(obj.surface)
                nbr, mask = self.arap_connectivity[name]
                X, _ = obj.deform(self.frames, points="surface", detach_weights=True)
                sample = torch.cat(
                    [  # one draw of n per video (METHOD §16)
                        losses.arap_sample(
                            X.shape[1],
                            obj.arap_sample_num,
                            1,
                            rng.generator(self.seed, self.video_index(b), it, f"arap/{name}"),
                        )
                        for b in range(B)
                    ]
                ).to(self.device)
                loss = losses.arap_energy(X, nbr, mask, sample) * lam_a / B
                total = total + loss
                out["arap"] += float(loss.detach())
            if (lam_c > 0 or lam_s > 0) and name in self.contact_points:
                points = self.contact_points[name]
                if name not in self.contact_rest:  # their signed distance at rest
                    self.contact_rest[name] = self.contact_grid(points).detach()
                rest = self.contact_rest[name]
                X, _ = obj.deform(self.frames, points, detach_weights=True, with_rotations=False)
                if lam_c > 0:
                    depth = (-rest).clamp(min=0)
                    loss = lam_c * contact.contact_loss(self.contact_grid, X, depth)
                    total = total + loss
                    out["contact"] += float(loss.detach())
                if lam_s > 0:
                    loss = lam_s * contact.support_loss(self.contact_grid, X, rest)
                    total = total + loss
                    out["support"] += float(loss.detach())
        if torch.is_tensor(total) and total.requires_grad:
            total.backward()
        return out

    def sds_terms(self, it: int, cams: dict) -> tuple:
        """The iteration's shared timestep t, SDS weight w and CFG scale, and the loss scale
        of each video (METHOD §11–§14)."""
        m, B = self.method, len(cams["viewmats"])
        t, w = rfsds.timestep_at(it, m.iterations, resample=m.resample_timestep)
        cfg = rfsds.cfg_scale_at(it, m.iterations, m.init_cfg_scale, m.last_cfg_scale)
        return t, w, cfg, self.sds_scale / B

    def target_grad(self, z: Tensor, video: Tensor, it: int, b: int, cams: dict, terms) -> Tensor:
        """g_b (METHOD §11, no grad) for the latents z of video b, from the teacher's guided
        velocity at the iteration's t. sds_grad zeroes NaN entries (METHOD §11); they are
        counted, so a teacher producing NaNs makes the step non-finite (skipped, rolled back)
        instead of vanishing."""
        t, w, cfg, _ = terms
        cond = self.guidance.condition(
            video.detach(),
            viewmat=cams["viewmats"][b],
            K=self.K,
            background=cams["backgrounds"][b],
        )
        eps = rfsds.noise_like(z, rng.generator(self.seed, self.video_index(b), it, "noise"))
        z_t = rfsds.noisy_latents(z, eps, t)
        v_hat = self.guidance.velocity(z_t[None], t, [cond], self.text, cfg)[0]
        self.teacher_nan = self.teacher_nan + torch.isnan(v_hat).sum()
        self.teacher_nonfinite = self.teacher_nonfinite + (~torch.isfinite(v_hat)).sum()
        return rfsds.sds_grad(z.detach(), eps, v_hat.to(z.dtype), w)

    def sds_joint(self, it: int, cams: dict) -> float:
        """METHOD §11–§15, the default mode: per video, render and encode with grad, the
        teacher's target, and one backward while the graphs live; returns the reported SDS
        loss ½·Σg² (times the scales)."""
        terms = self.sds_terms(it, cams)
        scale = terms[3]
        reported = []
        for b in range(len(cams["viewmats"])):

            def loss_of_video(video, b=b):
                z = self.encode(video)
                loss, rep = rfsds.sds_loss(z, self.target_grad(z, video, it, b, cams, terms))
                reported.append(float(rep) * scale)
                return loss * scale

            self.backprop_video(cams["viewmats"][b], cams["backgrounds"][b], loss_of_video)
            self.guidance.unload()
        return sum(reported)

    def sds_split(self, it: int, cams: dict) -> float:
        """METHOD §15, ``split_sds_backward``: the targets g_b of all videos without grad, the
        expert released, then each video re-rendered and re-encoded with grad and
        backpropagated against its stored g_b (∂L/∂z = g_b bit for bit, as in the default
        mode); returns the reported SDS loss."""
        terms = self.sds_terms(it, cams)
        scale = terms[3]
        B = len(cams["viewmats"])
        reported, targets, videos = 0.0, [], []
        with torch.no_grad():
            for b in range(B):
                video = self.render(cams["viewmats"][b], cams["backgrounds"][b], self.frames)
                z = self.encode(video)
                g = self.target_grad(z, video, it, b, cams, terms)
                reported += float(0.5 * g.square().sum()) * scale
                targets.append(g)  # g itself: recovering it from sg(z - g) would round
                if self.memory.split_render_backward:
                    # the backward's video leaf is this same render: keep it (in host RAM when
                    # on a GPU) instead of rendering it again
                    videos.append(video.cpu() if video.is_cuda else video)
        self.guidance.unload()
        for b in range(B):

            def loss_of_video(video, b=b):
                z = self.encode(video)
                loss, _ = rfsds.sds_loss(z, targets[b])
                return loss * scale

            video = videos[b] if videos else None
            self.backprop_video(
                cams["viewmats"][b], cams["backgrounds"][b], loss_of_video, video=video
            )
            if videos:
                videos[b] = None
        return reported

    def encode(self, video: Tensor) -> Tensor:
        """Latents of a video, under the Tiny VAE's checkpoints when asked (without grad: its
        lean pass)."""
        if self.memory.checkpoint_tiny_vae:
            return self.guidance.encode_video(video, checkpoint=True)
        return self.guidance.encode_video(video)

    # -- table operations (METHOD §6, §7) ---------------------------------------------------
    def before_step(self, it: int) -> None:
        m = self.method
        if it == m.back_iter and fenwick.reset_enabled(
            m.back_iter, m.iterations, m.prev_frame_number, m.frame_num
        ):
            for name, obj in self.scene.dynamic.items():
                fenwick.progressive_reset(obj.layer1.cp_deform.data, m.prev_frame_number)
                optimiser.zero_moments(self.optimizers[name], obj.layer1.cp_deform)
            logger.info("it %d: progressive reset after frame %d", it, m.prev_frame_number)
        if it == m.add_cp_layer_iter:
            for name in m.add_cp_objs:
                self.add_second_layer(name, it)
        if it == m.convert_cp_independent_iter:
            for name, obj in self.scene.dynamic.items():
                for layer in (obj.layer1, obj.layer2):
                    if layer is not None and not layer.per_frame:
                        layer.convert_to_per_frame()
                        optimiser.zero_moments(self.optimizers[name], layer.cp_deform)

    def add_second_layer(self, name: str, it: int) -> None:
        obj = self.scene.dynamic[name]
        if obj.layer2 is not None:
            return
        m = self.method
        centres, surface, _ = plan_second_layer(
            self.meshes[name],
            obj.rest_means.detach().cpu().numpy(),
            mem_init_voxel_size=self.surface_voxel_size[name],
            first_layer_count=obj.layer1.centres.shape[0],
            method=m,
        )
        t = lambda a: torch.as_tensor(a, dtype=obj.rest_means.dtype)  # noqa: E731
        obj.add_second_layer(
            t(centres), t(surface), mult_rot_way=m.mult_rot_way, detach_first=m.add_cp_detach_first
        )
        self.arap_connectivity.pop(name, None)
        optimiser.add_groups(self.optimizers[name], obj.param_groups(), m, it)
        logger.info("it %d: %s gets a second layer of %d control points", it, name, len(centres))

    # -- one iteration ---------------------------------------------------------------------
    def video_index(self, b: int) -> int:
        """Global index of this rank's video b: draws depend on it, so N ranks × B videos
        draw exactly what one process with N·B videos draws (rank r, B = 1: seed + r)."""
        return self.rank * self.method.batch_size + b

    def cameras_at(self, it: int) -> dict:
        """METHOD §8: this rank's B training cameras and backgrounds for iteration ``it``."""
        m = self.method
        per_video = [
            cameras.sample_training_cameras(
                1,
                rng.generator(self.seed, self.video_index(b), it, "cameras"),
                azim_l=m.azim_l,
                azim_r=m.azim_r,
                elev_l=m.elev_l,
                elev_r=m.elev_r,
                azim_segments=m.azim_segments,
                elev_segments=m.elev_segments,
                radius=m.cam_radius,
                target=self.target,
                invert_bg_prob=m.invert_bg_prob,
            )
            for b in range(m.batch_size)
        ]
        # drawn on the CPU (seeded generators), used where the scene lives
        return {k: torch.cat([c[k] for c in per_video]).to(self.device) for k in per_video[0]}

    def step(self, it: int) -> dict:
        """METHOD §17's order: table operations, LRs and cameras, regularisers, SDS, Adam."""
        self.before_step(it)
        for opt in self.optimizers.values():
            optimiser.set_learning_rates(opt, it, self.method)
        cams = self.cameras_at(it)
        clock = PhaseClock(self.memory.log_run_time)
        self.teacher_nan = self.teacher_nonfinite = 0
        with clock("regularisers"):
            reg = self.regularisers(it, cams)
        with clock("sds"):
            sds = self.sds(it, cams)
        with clock("all_reduce"):  # the NaN count too: every rank skips the same steps
            counts = {
                "teacher_nan": float(self.teacher_nan),
                "teacher_nonfinite": float(self.teacher_nonfinite),
            }
            summed = self.all_reduce({**counts, "sds": sds, **reg})
        nan = int(summed["teacher_nan"])
        if self.group.distributed:  # the losses of every rank's videos: what one process logs
            sds = summed["sds"] / self.world_size
            reg = {k: summed[k] / self.world_size for k in reg}
        params = [
            p
            for opt in self.optimizers.values()
            for g in opt.param_groups
            for p in g["params"]
            if p.grad is not None
        ]
        # the non-finite entries of the teacher's velocities (every rank's) and of the averaged
        # gradients: logged every iteration, the step skipped when any (METHOD §11, ours)
        entries = int(summed["teacher_nonfinite"]) + sum(
            int((~torch.isfinite(p.grad)).sum()) for p in params
        )
        finite = entries == 0 and math.isfinite(sds)
        if finite:
            for opt in self.optimizers.values():
                opt.step()
            self.nonfinite = 0
        else:
            self.nonfinite += 1
            logger.warning(
                "it %d: non-finite %s (%d non-finite entries), step skipped (%d in a row)",
                it,
                f"teacher velocity ({nan} NaN entries)" if nan else "loss or gradient",
                entries,
                self.nonfinite,
            )
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        t, _ = rfsds.timestep_at(it, self.method.iterations, resample=self.method.resample_timestep)
        cfg = rfsds.cfg_scale_at(
            it, self.method.iterations, self.method.init_cfg_scale, self.method.last_cfg_scale
        )
        rec = {
            "it": it,
            "sds": sds,
            **reg,
            "t": t,
            "cfg": cfg,
            "skipped": int(not finite),
            "nan": nan,
            "nonfinite_entries": entries,
        }
        if self.memory.log_run_time:
            rec.update(clock.times, sds_scale=self.sds_scale, temporal_scale=self.temporal_scale)
        return rec

    def all_reduce(self, counts: dict | None = None) -> dict:
        """METHOD §18: average gradients over ranks (a missing gradient counts as zero); sums
        ``counts`` over ranks in the same collective and returns them."""
        params = [
            p for opt in self.optimizers.values() for g in opt.param_groups for p in g["params"]
        ]
        return self.group.average_gradients(params, counts or {})

"""Stage ``export`` (METHOD §19–§20): the trained scene as videos (reference view, orbit,
four fixed views), a GIF preview, the animated ``dynamic_scene.glb`` and a per-frame 3DGS PLY
sequence. ``chord render`` and ``chord export-glb`` call the same functions."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from chord import cameras, config, export, gaussians, media, paths, train
from chord.motion import build_scene, state
from chord.stages import ingest
from chord.stages.reference import target_of
from chord.stages.train import run_inputs

logger = logging.getLogger(__name__)


final_stage = config.final_stage


def video_fps(method) -> int:
    """METHOD §19: videos play at ``save_fps``, or 24 when T > 41."""
    return 24 if method.frame_num > 41 else method.save_fps


def frame_count(frame_num: int, lst_frame: int | None) -> int:
    """F = min(T, lst_frame) (METHOD §20); lst_frame None or −1 means T."""
    if lst_frame is None or lst_frame == -1:
        return frame_num
    if lst_frame < 1:
        raise ValueError(
            f"--lst_frame: expected a frame count ≥ 1 (or -1 for all), got {lst_frame}"
        )
    return min(frame_num, lst_frame)


def load_trained(
    *,
    scene_json: Path,
    plys: dict[str, Path],
    voxels: dict[str, Path],
    state_path: Path,
    frame_num: int | None = None,
    sh_degree: int = 3,
) -> tuple[dict, object, dict]:
    """(scene.json mapping, :class:`~chord.motion.MotionScene` with the trained motion, the
    checkpoint dict) from the stage files of one scene and a training state. The motion's
    shape (frames, neighbours) comes from the state; ``frame_num`` only matters for a scene
    without dynamic objects (default: the method default)."""
    doc = ingest.read(scene_json)
    ckpt = train.load_checkpoint(state_path)
    meta = ckpt["motion_meta"]
    names = [o["name"] for o in doc["objects"] if o["role"] != "avoided"]
    dynamic = [o["name"] for o in doc["objects"] if o["role"] == "dynamic"]
    missing = sorted(set(names) - set(plys)) + sorted(set(dynamic) - set(voxels))
    if missing:
        raise ValueError(f"{scene_json}: no Gaussians or voxels given for {missing}")
    infos = list(meta["objects"].values())
    shape = {} if frame_num is None else {"frame_num": frame_num}
    if infos:
        shape = {k: infos[0][k] for k in ("frame_num", "n_cp_num", "arap_sample_num")}
    shape = config.method_from_mapping(shape, where=str(state_path))
    gsets = {n: gaussians.read_ply(plys[n], sh_degree_cap=sh_degree) for n in names}
    vox = {}
    for name in dynamic:
        with np.load(voxels[name]) as z:
            vox[name] = {k: z[k] for k in ("control_points", "surface")}
    scene = build_scene(doc, gsets, vox, shape)
    state.restore(scene, ckpt["motion"], meta, where=str(state_path))
    return doc, scene, ckpt


def deformer(obj, frames: int) -> export.Deformer:
    """Normalised rest points [n, 3] -> positions [F, n, 3] under ``obj``'s trained motion."""

    def apply(points: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(points, dtype=obj.rest_means.dtype)
        with torch.no_grad():
            X, _ = obj.deform(torch.arange(frames), x, with_rotations=False)
        return X.double().numpy()

    return apply


def check_objects(doc: dict, names, flag: str) -> list[str]:
    """``names`` as a list, each an object of the scene (else a ValueError naming ``flag``)."""
    known = [o["name"] for o in doc["objects"]]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"{flag}: {unknown} are not objects of this scene {known}")
    return list(names)


def write_glb(
    out: Path,
    *,
    doc: dict,
    scene,
    sources: dict[str, Path],
    frames: int,
    fps: float,
    exclude_objs=(),
    static_objs=(),
) -> dict:
    """``dynamic_scene.glb`` of every non-avoided, non-excluded object (source GLBs
    ``sources``); static objects (and ``static_objs``) are copied unanimated."""
    exclude = set(check_objects(doc, exclude_objs, "exclude_objs"))
    frozen = set(check_objects(doc, static_objs, "static_objs"))
    objects = []
    for o in doc["objects"]:
        name = o["name"]
        if o["role"] == "avoided" or name in exclude:
            continue
        if name not in sources:
            raise ValueError(f"no source GLB given for {name}")
        animated = name in scene.dynamic and name not in frozen
        objects.append(
            (name, sources[name], deformer(scene.dynamic[name], frames) if animated else None)
        )
    c, s = doc["normalisation"]["centre"], doc["normalisation"]["scale"]
    summary = export.dynamic_scene_glb(out, objects, centre=c, scale=s, frames=frames, fps=fps)
    logger.info(
        "%s: %d objects, %d animated nodes, %d morph targets at %g fps",
        out,
        len(objects),
        summary["nodes"],
        summary["targets"],
        fps,
    )
    return summary


def scene_frames(scene, frames: int, *, objects: list[str], static_objs=()) -> dict:
    """Per-frame Gaussians of ``objects`` (``static_objs`` held at rest) over frames 0..F−1."""
    with torch.no_grad():
        g = scene.frame_gaussians(torch.arange(frames), objects=objects)
    start = 0
    for name in objects:  # frame_gaussians concatenates ``objects`` in the given order
        n = scene.slices[name].stop - scene.slices[name].start
        if name in static_objs:
            g["means"][:, start : start + n] = scene.means[scene.slices[name]]
            g["quats"][:, start : start + n] = scene.quats[scene.slices[name]]
        start += n
    return g


def run(
    *,
    scene_json: Path,
    plys: dict[str, Path],
    voxels: dict[str, Path],
    state_path: Path,
    sources: dict[str, Path],
    method,
    out_ref_view: Path,
    out_orbit: Path,
    out_views: dict[str, Path],
    out_gif: Path,
    out_glb: Path,
    out_ply_dir: Path,
) -> dict:
    """Render and write every export of a trained scene at the SDS ``size``."""
    width, height = config.parse_size(method.size, where="method: size")
    doc, scene, ckpt = load_trained(
        scene_json=scene_json,
        plys=plys,
        voxels=voxels,
        state_path=state_path,
        frame_num=method.frame_num,
        sh_degree=method.sh_degree,
    )
    T, fps = scene_frame_num(scene, method), video_fps(method)
    g = scene_frames(scene, T, objects=scene.names)
    K = cameras.intrinsics(width, height, method.fovy)
    bg = cameras.background_for(method.invert_bg_prob)
    target = target_of(method, doc)
    elev = (method.elev_l + method.elev_r) / 2.0

    def video(path: Path, viewmats: torch.Tensor) -> np.ndarray:
        images = media.to_uint8(export.render_frames(g, viewmats, K, width, height, bg))
        media.write_mp4(path, images, fps)
        logger.info("%s: %d frames", path, len(images))
        return images

    ref = cameras.reference_view(
        method.elev_l, method.elev_r, method.ref_azim, method.ref_cam_radius, target
    )
    ref_images = video(out_ref_view, ref)
    export.write_gif(out_gif, ref_images, fps)
    azim = method.ref_azim + torch.arange(T, dtype=torch.float64) * 360.0 / T
    video(
        out_orbit,
        cameras.orbit_viewmats(torch.full_like(azim, elev), azim, method.cam_radius, target),
    )
    for name, path in out_views.items():
        if name not in paths.FIXED_VIEWS:
            raise ValueError(f"out_views: {name!r} is not one of {sorted(paths.FIXED_VIEWS)}")
        video(
            path, cameras.orbit_viewmats(elev, paths.FIXED_VIEWS[name], method.cam_radius, target)
        )
    rest = gaussians.concat(
        [gaussians.read_ply(plys[n], sh_degree_cap=method.sh_degree) for n in scene.names]
    )
    export.write_ply_sequence(out_ply_dir, rest, g["means"], g["quats"])
    glb = write_glb(out_glb, doc=doc, scene=scene, sources=sources, frames=T, fps=method.save_fps)
    logger.info(
        "%s: iteration %d, %d frames at %dx%d, %d fps; GLB with %d morph targets",
        doc["scene"],
        ckpt["iteration"],
        T,
        width,
        height,
        fps,
        glb["targets"],
    )
    return {"frames": T, "iteration": ckpt["iteration"], **glb}


def scene_frame_num(scene, method) -> int:
    """T of the trained motion (the method's frame_num when nothing moves)."""
    objs = list(scene.dynamic.values())
    return objs[0].frame_num if objs else method.frame_num


# -- run folders of ``chord train`` (``chord render``, ``chord export-glb``) ----------------


def find_state(root: Path, checkpoint: int = -1) -> tuple[Path, int]:
    """(state file, iteration) of a run folder. ``checkpoint`` −1: the final hand-off state
    (train/fine.pt, else train/coarse.pt), else the newest resume checkpoint; k ≥ 0: the
    checkpoint of iteration k (METHOD §20)."""
    root = Path(root)
    handoffs = [root / "train" / f"{st}.pt" for st in ("fine", "coarse")]
    ckpts = {}  # iteration -> path, fine before coarse
    for st in ("coarse", "fine"):
        for p in sorted((root / "checkpoints" / st).glob("*/ckpt_*.pt")):
            ckpts[int(p.stem.split("_")[1])] = p
    if checkpoint == -1:
        for p in handoffs:
            if p.is_file():
                return p, int(train.load_checkpoint(p)["iteration"])
        if ckpts:
            it = max(ckpts)
            return ckpts[it], it
        raise ValueError(f"{root}: no trained state (train/*.pt or checkpoints/) to export")
    if checkpoint < -1:
        raise ValueError(f"--checkpoint: expected -1 (latest) or an iteration, got {checkpoint}")
    if checkpoint in ckpts:
        return ckpts[checkpoint], checkpoint
    for p in handoffs:
        if p.is_file() and int(train.load_checkpoint(p)["iteration"]) == checkpoint:
            return p, checkpoint
    raise ValueError(
        f"--checkpoint: no state of iteration {checkpoint} under {root} "
        f"(checkpoints at {sorted(ckpts)}; -1 = the latest)"
    )


def check_static_id(doc: dict, static_id: int | None) -> None:
    if static_id is not None and static_id != doc["static_id"]:
        raise ValueError(
            f"--static_id: {static_id}, but the run was trained with static_id {doc['static_id']}"
        )


def render_run(
    root: Path,
    *,
    checkpoint: int = -1,
    width: int,
    height: int,
    azim: float,
    elev: float,
    cam_radius: float,
    cam_height: float = 0.0,
    fovy: float = cameras.FOVY,
    fps: int = 10,
    lst_frame: int | None = None,
    invert_bg_prob: float = -1.0,
    static_id: int | None = None,
    exclude_objs=(),
    additional_static_objs=(),
    no_bg: bool = False,
) -> Path:
    """METHOD §20's single-view render of a run folder: an mp4 named by azimuth and
    elevation under rendered_videos/iteration_<it>/; returns its path."""
    root = Path(root)
    state_path, it = find_state(root, checkpoint)
    inputs = run_inputs(root)
    doc, scene, _ = load_trained(**inputs, state_path=state_path)
    check_static_id(doc, static_id)
    exclude = set(check_objects(doc, exclude_objs, "--exclude_objs"))
    frozen = set(check_objects(doc, additional_static_objs, "--additional_static_objs"))
    static = {o["name"] for o in doc["objects"] if o["role"] == "static"}
    objects = [n for n in scene.names if n not in exclude and not (no_bg and n in static)]
    if not objects:
        raise ValueError("--exclude_objs/--no_bg: nothing is left to render")
    T = frame_count(next((o.frame_num for o in scene.dynamic.values()), 1), lst_frame)
    g = scene_frames(scene, T, objects=objects, static_objs=frozen)
    view = cameras.orbit_viewmats(elev, azim, cam_radius, (0.0, cam_height, 0.0))
    K = cameras.intrinsics(width, height, fovy)
    images = export.render_frames(g, view, K, width, height, cameras.background_for(invert_bg_prob))
    out = root / "rendered_videos" / f"iteration_{it}" / f"azim_{azim:g}_elev_{elev:g}.mp4"
    media.write_mp4(out, images, fps)
    logger.info("%s: %d frames of iteration %d at %dx%d", out, T, it, width, height)
    return out


def export_glb_run(
    root: Path,
    *,
    mesh_source_path: Path,
    checkpoint: int = -1,
    fps: float = 12,
    lst_frame: int | None = None,
    static_id: int | None = None,
    exclude_objs=(),
    additional_static_objs=(),
    exclude_plane: bool = False,
) -> Path:
    """METHOD §20's animated glTF of a run folder, from the source GLBs in
    ``mesh_source_path``: saved_meshes/iteration_<it>/dynamic_scene.glb; returns its path."""
    from chord import scene as sc

    root, data = Path(root), Path(mesh_source_path)
    state_path, it = find_state(root, checkpoint)
    inputs = run_inputs(root)
    doc, scene, _ = load_trained(**inputs, state_path=state_path)
    check_static_id(doc, static_id)
    files = sc.discover_objects(data)
    if len(files) != len(doc["objects"]):
        raise ValueError(
            f"--mesh_source_path: {data} holds {len(files)} objects, the run has "
            f"{len(doc['objects'])}"
        )
    sources = {f.stem: f for f in files}
    if exclude_plane:  # METHOD §20: static_obj.glb replaces the static object
        plane = data / "static_obj.glb"
        if not plane.is_file():
            raise ValueError(f"--exclude_plane: {plane} does not exist")
        sources[f"obj_{doc['static_id']}"] = plane
    T = frame_count(next((o.frame_num for o in scene.dynamic.values()), 1), lst_frame)
    out = root / "saved_meshes" / f"iteration_{it}" / "dynamic_scene.glb"
    write_glb(
        out,
        doc=doc,
        scene=scene,
        sources=sources,
        frames=T,
        fps=fps,
        exclude_objs=exclude_objs,
        static_objs=additional_static_objs,
    )
    return out

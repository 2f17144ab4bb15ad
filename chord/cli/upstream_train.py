"""Run folders of CHORD's scripts: ``chord train`` (CHORD's train.py command line, METHOD
glossary), ``chord render`` and ``chord export-glb`` (its render_scene.py and
save_dynamic_scene_glb.py, METHOD §20).

``chord train``'s method and memory flags are generated from the config schema, so names, types
and defaults have one source; the seed documents' commands work with ``python train.py``
replaced by ``chord train``. A run writes under ``--model``/``--ex_name``: the same files the
workflow writes per scene (scene/, gaussians/, voxels/, condition/, train/), plus checkpoints/
for resume; render and export-glb read that folder.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from chord.config import settings
from chord.core import media
from chord.core.errors import InputError
from chord.export.trained_scene import (
    check_objects,
    frame_count,
    load_trained,
    scene_frames,
    write_glb,
)
from chord.plan import results_layout
from chord.render import cameras
from chord.render.views import render_frames
from chord.scene import ingestion
from chord.stages import gaussians, ingest, voxelize
from chord.training.checkpoint import load_checkpoint

logger = logging.getLogger(__name__)

# flags accepted for compatibility that change nothing here (METHOD glossary)
NO_EFFECT = {
    "white_background": "store_true",
    "mesh_config_path": str,
    "is_marbles": "store_true",
    "convert_model_dtype": "store_true",
    "image": str,
}
ALIASES = {"lambda_arap_landmarks": "arap_landmarks", "lambda_dis_landmarks": "time_loss_landmarks"}


def _item_type(spec: dict):
    kind = spec.get("type")
    if isinstance(kind, list):  # e.g. [integer, "null"]
        kind = next(k for k in kind if k != "null")
    return {"integer": int, "number": float, "boolean": bool, "string": str}.get(kind)


def add_schema_flags(parser: argparse.ArgumentParser, section: dict) -> None:
    """One flag per key of a config ``section`` (method, memory): --<key>, typed from the
    schema; unset flags keep defaults."""
    schema = settings.read_schema(settings.CONFIG_SCHEMA)
    defs = schema["$defs"]
    for key, spec in section["properties"].items():
        if "$ref" in spec:
            spec = {**defs[spec["$ref"].split("/")[-1]], **spec}
        kw = {"dest": key, "default": argparse.SUPPRESS, "help": spec.get("description")}
        if spec.get("type") == "boolean":
            if spec["default"]:
                parser.add_argument(f"--{key}", action=argparse.BooleanOptionalAction, **kw)
            else:
                parser.add_argument(f"--{key}", action="store_true", **kw)
        elif spec.get("type") == "array":
            item = spec.get("items", {})
            if "$ref" in item:
                item = defs[item["$ref"].split("/")[-1]]
            parser.add_argument(f"--{key}", nargs="*", type=_item_type(item) or str, **kw)
        elif spec.get("type") == "object":
            continue  # per-object mappings (gs_init_nums) live in the config file only
        elif "enum" in spec:
            kind = type(spec["enum"][0])
            parser.add_argument(f"--{key}", type=kind, choices=spec["enum"], **kw)
        else:
            parser.add_argument(f"--{key}", type=_item_type(spec) or str, **kw)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chord train", description=__doc__.splitlines()[0])
    p.add_argument(
        "--mesh_source_path", required=True, help="scene folder: scene.glb and obj_<i>.glb"
    )
    p.add_argument(
        "-m",
        "--model_path",
        "--model",
        dest="model_path",
        required=True,
        help="output root (may hold fitted 3DGS as obj_<i>/point_cloud/...)",
    )
    p.add_argument("--prompt", required=True)
    p.add_argument("--ckpt_dir", help="Wan2.2-I2V-A14B-Diffusers folder (wan guidance)")
    p.add_argument("--tiny_vae_path")
    p.add_argument("--image_width", type=int, help="overridden by --size")
    p.add_argument("--image_height", type=int, help="overridden by --size")
    p.add_argument("--ulysses_size", type=int, default=1)
    p.add_argument("--t5_fsdp", action="store_true")
    p.add_argument("--dit_fsdp", action="store_true")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--stage", choices=("coarse", "fine", "full"), default="full")
    p.add_argument(
        "--render_backend",
        choices=("auto", "gsplat", "torch"),
        default="auto",
        help="auto: gsplat's CUDA kernels on a GPU (an error if they do not load), torch on a CPU",
    )
    for name, kind in NO_EFFECT.items():
        if kind == "store_true":
            p.add_argument(f"--{name}", action="store_true", help="accepted; no effect")
        else:
            p.add_argument(f"--{name}", type=kind, help="accepted; no effect")
    p.add_argument("-w", dest="white_background", action="store_true", help=argparse.SUPPRESS)
    for alias, key in ALIASES.items():
        p.add_argument(
            f"--{alias}",
            dest=key,
            nargs="*",
            type=float,
            default=argparse.SUPPRESS,
            help=f"alias of --{key}",
        )
    add_schema_flags(p, settings.method_schema())
    add_schema_flags(p, settings.memory_schema())
    return p


def parse(argv: list[str]):
    """(args, method, memory) from a CHORD command line; invalid values raise ConfigError."""
    args = build_parser().parse_args(argv)
    if args.ulysses_size != 1:
        raise settings.ConfigError(
            f"--ulysses_size: {args.ulysses_size}; only 1 (no sequence parallelism) is supported"
        )
    for flag in ("t5_fsdp", "dit_fsdp"):
        if getattr(args, flag):
            raise settings.ConfigError(
                f"--{flag}: sharded Wan is not supported; use torchrun data "
                "parallelism (one model per GPU) or --enable_mmgp"
            )
    given = vars(args)
    method = settings.method_from_mapping(
        {k: v for k, v in given.items() if k in settings.method_schema()["properties"]},
        where="chord train",
    )
    memory = settings.memory_from_mapping(
        {k: v for k, v in given.items() if k in settings.MEMORY_FLAGS}, where="chord train"
    )
    return args, method, memory


def prepare(args, method, guidance, data: Path, res: Path, s: str, scene: str) -> None:
    """The workflow's stages for one scene under <model>/<ex_name>: geometry (importing the
    fitted 3DGS under --model when present) and text conditioning."""
    from chord.plan import results_layout
    from chord.stages import condition

    fitted = Path(args.model_path)
    has_fitted = any(fitted.glob("obj_*/point_cloud"))
    prepare_geometry(
        data=data,
        results=res,
        scene=s,
        method=method,
        fitted=fitted if has_fitted else None,
        name=scene,
    )
    condition.run(
        out=results_layout.text_condition(res, s),
        prompt=args.prompt,
        n_prompt=method.n_prompt,
        guidance=guidance,
        method=method,
        scene=scene,
    )


def train(argv: list[str]) -> int:
    """Prepare the scene and train it. Under torchrun (WORLD_SIZE > 1) every rank trains
    its own batch_size videos on its own GPU (LOCAL_RANK) with gradients averaged; rank 0
    prepares and writes."""
    import os

    from chord.plan import results_layout
    from chord.stages import train as train_stage
    from chord.training import distributed, live_preview
    from chord.training.run_settings import RunSettings

    args, method, memory = parse(argv)
    guidance = settings.guidance_from_mapping(
        {
            "backend": "wan" if args.ckpt_dir else "oracle",
            "ckpt_dir": args.ckpt_dir,
            "tiny_vae_path": args.tiny_vae_path,
        }
    )
    settings.check_guidance(guidance, {"chord train": method}, flags=True)
    data = Path(args.mesh_source_path)
    root = Path(args.model_path) / method.ex_name
    res, s = root.parent, root.name  # paths.* take (results, scene): <model>/<ex_name>/...
    group = distributed.from_env(os.environ, device_index=args.device)
    try:
        if group.rank == 0:
            prepare(args, method, guidance, data, res, s, data.name or "scene")
        group.barrier()
        inputs = {
            **run_inputs(res / s),
            "text_path": results_layout.text_condition(res, s),
            "data_dir": data,
        }
        stages = ["coarse", "fine"] if args.stage == "full" else [args.stage]
        if not method.add_cp_objs:
            stages = ["coarse"]
        train_dir = root / "train"
        for st in stages:
            summary = train_stage.run_stage(
                st,
                inputs=inputs,
                out=train_dir / f"{st}.pt",
                loss_log=train_dir / f"{st}_losses.tsv",
                checkpoint_dir=root / "checkpoints" / st,
                method=method,
                memory=memory,
                guidance=guidance,
                handoff=train_dir / "coarse.pt" if st == "fine" else None,
                device=group.device,
                group=group,
                render_backend=args.render_backend,
                env=os.environ,
                run_settings=RunSettings(
                    scene=s,
                    progress_every_s=method.progress_every_s,
                    preview=live_preview.view_keys(method, results_layout.previews_dir(res, s)),
                ),
            )
            logger.info(
                "%s: iterations %d..%d (seed %d)",
                st,
                summary["start"],
                summary["last"],
                summary["seed"],
            )
    finally:
        distributed.close(group)
    return 0


def prepare_geometry(
    *,
    data: Path,
    results: Path,
    scene: str,
    method,
    fitted: Path | None = None,
    name: str | None = None,
) -> dict:
    """The three geometry stages for one scene in a row (``ingest``, ``gaussians``,
    ``voxelize``) into the results layout: what the workflow runs as separate rules, for
    ``chord train``, the benchmarks and the tests. Outputs go to results/<scene>/...;
    ``name`` is the scene name recorded in scene.json
    (default ``scene``). Returns {"doc": the scene.json mapping, "plys": {obj: path},
    "voxels": {obj: path}, "stats": {obj: voxelize summary}}."""
    scene_json = results_layout.scene_json(results, scene)
    doc = ingest.run(
        data=data,
        out_json=scene_json,
        out_meshes=results_layout.meshes_dir(results, scene),
        method=method,
        scene=name or scene,
    )
    plys, voxels, stats = {}, {}, {}
    for o in doc["objects"]:
        name = o["name"]
        if o["role"] == "avoided":
            continue
        plys[name] = results_layout.gaussians_ply(results, scene, name)
        gaussians.run(scene_json=scene_json, obj=name, out=plys[name], method=method, fitted=fitted)
        if o["role"] == "dynamic":
            voxels[name] = results_layout.voxels_npz(results, scene, name)
            stats[name] = voxelize.run(
                scene_json=scene_json,
                obj=name,
                gaussians=plys[name],
                out=voxels[name],
                method=method,
            )
    return {"doc": doc, "plys": plys, "voxels": voxels, "stats": stats}


def oracle_train_inputs(*, data: Path, results: Path, scene: str, method) -> dict:
    """:func:`prepare_geometry`, then the inputs of a training of that scene with the oracle
    guidance (``chord.training.scene_trainer.build``, ``chord.stages.train.run_stage``): its files,
    no text condition and
    the scene's data folder (its motion.json)."""
    out = prepare_geometry(data=data, results=results, scene=scene, method=method)
    return {
        "scene_json": results_layout.scene_json(results, scene),
        "plys": out["plys"],
        "voxels": out["voxels"],
        "text_path": None,
        "data_dir": data,
    }


def run_inputs(root: Path) -> dict:
    """scene.json, Gaussians and voxels of a ``chord train`` run folder <model>/<ex_name>."""
    root = Path(root)
    res, s = root.parent, root.name
    scene_json = results_layout.scene_json(res, s)
    if not scene_json.is_file():
        raise InputError(f"{root}: not a chord train run folder ({scene_json} is missing)")
    doc = ingestion.read_scene_json(scene_json)
    return {
        "scene_json": scene_json,
        "plys": {
            o["name"]: results_layout.gaussians_ply(res, s, o["name"])
            for o in doc["objects"]
            if o["role"] != "avoided"
        },
        "voxels": {
            o["name"]: results_layout.voxels_npz(res, s, o["name"])
            for o in doc["objects"]
            if o["role"] == "dynamic"
        },
    }


# -- chord render, chord export-glb ------------------------------------------------------------


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
                return p, int(load_checkpoint(p)["iteration"])
        if ckpts:
            it = max(ckpts)
            return ckpts[it], it
        raise InputError(f"{root}: no trained state (train/*.pt or checkpoints/) to export")
    if checkpoint < -1:
        raise InputError(f"--checkpoint: expected -1 (latest) or an iteration, got {checkpoint}")
    if checkpoint in ckpts:
        return ckpts[checkpoint], checkpoint
    for p in handoffs:
        if p.is_file() and int(load_checkpoint(p)["iteration"]) == checkpoint:
            return p, checkpoint
    raise InputError(
        f"--checkpoint: no state of iteration {checkpoint} under {root} "
        f"(checkpoints at {sorted(ckpts)}; -1 = the latest)"
    )


def check_static_id(doc: dict, static_id: int | None) -> None:
    if static_id is not None and static_id != doc["static_id"]:
        raise InputError(
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
        raise InputError("--exclude_objs/--no_bg: nothing is left to render")
    T = frame_count(next((o.frame_num for o in scene.dynamic.values()), 1), lst_frame)
    g = scene_frames(scene, T, objects=objects, static_objs=frozen)
    view = cameras.orbit_viewmats(elev, azim, cam_radius, (0.0, cam_height, 0.0))
    K = cameras.intrinsics(width, height, fovy)
    images = render_frames(g, view, K, width, height, cameras.background_for(invert_bg_prob))
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
    skinned: bool = False,
) -> Path:
    """METHOD §20's animated glTF of a run folder, from the source GLBs in
    ``mesh_source_path``: saved_meshes/iteration_<it>/dynamic_scene.glb (morph targets), or
    with ``skinned`` dynamic_scene_skinned.glb (a skin on the control points); returns its
    path."""

    root, data = Path(root), Path(mesh_source_path)
    state_path, it = find_state(root, checkpoint)
    inputs = run_inputs(root)
    doc, scene, _ = load_trained(**inputs, state_path=state_path)
    check_static_id(doc, static_id)
    files = ingestion.discover_objects(data)
    if len(files) != len(doc["objects"]):
        raise InputError(
            f"--mesh_source_path: {data} holds {len(files)} objects, the run has "
            f"{len(doc['objects'])}"
        )
    sources = {f.stem: f for f in files}
    if exclude_plane:  # METHOD §20: static_obj.glb replaces the static object
        plane = data / "static_obj.glb"
        if not plane.is_file():
            raise InputError(f"--exclude_plane: {plane} does not exist")
        sources[f"obj_{doc['static_id']}"] = plane
    T = frame_count(next((o.frame_num for o in scene.dynamic.values()), 1), lst_frame)
    name = "dynamic_scene_skinned.glb" if skinned else "dynamic_scene.glb"
    out = root / "saved_meshes" / f"iteration_{it}" / name
    write_glb(
        out,
        doc=doc,
        scene=scene,
        sources=sources,
        frames=T,
        fps=fps,
        exclude_objs=exclude_objs,
        static_objs=additional_static_objs,
        skinned=skinned,
    )
    return out

"""``chord train``: CHORD's train.py command line (METHOD glossary). Every method flag is
generated from the config schema, so names, types and defaults have one source; the seed
documents' commands work with ``python train.py`` replaced by ``chord train``.

The run writes under ``--model``/``--ex_name``: the same files the workflow writes per scene
(scene/, gaussians/, voxels/, condition/, train/), plus checkpoints/ for resume.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from chord import config as cc

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
    schema = cc.read_schema(cc.CONFIG_SCHEMA)
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
    add_schema_flags(p, cc.method_schema())
    add_schema_flags(p, cc.memory_schema())
    return p


def parse(argv: list[str]):
    """(args, method, memory) from a CHORD command line; invalid values raise ConfigError."""
    args = build_parser().parse_args(argv)
    if args.ulysses_size != 1:
        raise cc.ConfigError(
            f"--ulysses_size: {args.ulysses_size}; only 1 (no sequence parallelism) is supported"
        )
    for flag in ("t5_fsdp", "dit_fsdp"):
        if getattr(args, flag):
            raise cc.ConfigError(
                f"--{flag}: sharded Wan is not supported; use torchrun data "
                "parallelism (one model per GPU) or --enable_mmgp"
            )
    given = vars(args)
    method = cc.method_from_mapping(
        {k: v for k, v in given.items() if k in cc.method_schema()["properties"]},
        where="chord train",
    )
    memory = cc.memory_from_mapping(
        {k: v for k, v in given.items() if k in cc.MEMORY_FLAGS}, where="chord train"
    )
    return args, method, memory


def prepare(args, method, guidance, data: Path, res: Path, s: str, scene: str) -> None:
    """The workflow's stages for one scene under <model>/<ex_name>: geometry (importing the
    fitted 3DGS under --model when present) and text conditioning."""
    from chord import paths
    from chord.stages import condition, geometry

    fitted = Path(args.model_path)
    has_fitted = any(fitted.glob("obj_*/point_cloud"))
    geometry.run(
        data=data,
        results=res,
        scene=s,
        method=method,
        fitted=fitted if has_fitted else None,
        name=scene,
    )
    condition.run(
        out=paths.text_condition(res, s),
        prompt=args.prompt,
        n_prompt=method.n_prompt,
        guidance=guidance,
        method=method,
        scene=scene,
    )


def run(argv: list[str]) -> int:
    """Prepare the scene and train it. Under torchrun (WORLD_SIZE > 1) every rank trains
    its own batch_size videos on its own GPU (LOCAL_RANK) with gradients averaged; rank 0
    prepares and writes."""
    import os

    from chord import distributed, paths
    from chord.stages import train as train_stage

    args, method, memory = parse(argv)
    guidance = cc.guidance_from_mapping(
        {
            "backend": "wan" if args.ckpt_dir else "oracle",
            "ckpt_dir": args.ckpt_dir,
            "tiny_vae_path": args.tiny_vae_path,
        }
    )
    cc.check_guidance(guidance, {"chord train": method}, flags=True)
    data = Path(args.mesh_source_path)
    root = Path(args.model_path) / method.ex_name
    res, s = root.parent, root.name  # paths.* take (results, scene): <model>/<ex_name>/...
    group = distributed.from_env(os.environ, device_index=args.device)
    try:
        if group.rank == 0:
            prepare(args, method, guidance, data, res, s, data.name or "scene")
        group.barrier()
        inputs = {
            **train_stage.run_inputs(res / s),
            "text_path": paths.text_condition(res, s),
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

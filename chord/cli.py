"""The ``chord`` command. Each stage subcommand calls the same ``chord.stages.<stage>.run`` as
the Snakemake rule, with the same paths, so a scene can be prepared without Snakemake."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chord import config as cfg
from chord import paths
from chord.scene import SceneError

logger = logging.getLogger("chord")

EXIT_INPUT = 2  # bad configuration or scene input


def _load(args) -> cfg.Config:
    return cfg.load_file(Path(args.config))


def _spec(conf: cfg.Config, scene: str) -> cfg.SceneSpec:
    if scene not in conf.scenes:
        raise cfg.ConfigError(f"--scene: {scene!r} is not in the scene sheet {sorted(conf.scenes)}")
    return conf.scenes[scene]


def _roles(conf: cfg.Config, spec: cfg.SceneSpec) -> dict[str, str]:
    from chord.stages import ingest

    doc = ingest.read(paths.scene_json(conf.results, spec.scene))
    return {o["name"]: o["role"] for o in doc["objects"]}


def cmd_validate(args) -> int:
    conf = _load(args)
    for name, spec in conf.scenes.items():
        print(f"{name}\t{spec.data}\ttier={spec.tier}\t{spec.prompt}")
    print(f"config {args.config}: {len(conf.scenes)} scene(s) valid", file=sys.stderr)
    return 0


def cmd_demo_scenes(args) -> int:
    from chord import demo

    names = args.names or list(demo.DEMO_SCENES)
    unknown = sorted(set(names) - set(demo.DEMO_SCENES))
    if unknown:
        raise cfg.ConfigError(
            f"--names: unknown demo scene(s) {unknown}; choose from {sorted(demo.DEMO_SCENES)}"
        )
    for folder in demo.write_demo_scenes(Path(args.outdir), names, frame_num=args.frame_num):
        print(folder)
    return 0


def cmd_ingest(args) -> int:
    from chord.stages import ingest

    conf = _load(args)
    spec = _spec(conf, args.scene)
    ingest.run(
        data=spec.data,
        out_json=paths.scene_json(conf.results, spec.scene),
        out_meshes=paths.meshes_dir(conf.results, spec.scene),
        method=spec.method,
        scene=spec.scene,
    )
    return 0


def cmd_gaussians(args) -> int:
    from chord.stages import gaussians

    conf = _load(args)
    spec = _spec(conf, args.scene)
    roles = _roles(conf, spec)
    for obj in args.obj or [o for o, r in roles.items() if r != "avoided"]:
        gaussians.run(
            scene_json=paths.scene_json(conf.results, spec.scene),
            obj=obj,
            out=paths.gaussians_ply(conf.results, spec.scene, obj),
            method=spec.method,
            fitted=spec.gaussians,
        )
    return 0


def cmd_voxelize(args) -> int:
    from chord.stages import voxelize

    conf = _load(args)
    spec = _spec(conf, args.scene)
    roles = _roles(conf, spec)
    for obj in args.obj or [o for o, r in roles.items() if r == "dynamic"]:
        voxelize.run(
            scene_json=paths.scene_json(conf.results, spec.scene),
            obj=obj,
            gaussians=paths.gaussians_ply(conf.results, spec.scene, obj),
            out=paths.voxels_npz(conf.results, spec.scene, obj),
            method=spec.method,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chord", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="CHORD train.py flags (see `chord train --help`)", add_help=False)

    def with_config(sp):
        sp.add_argument("--config", default="config/config.yaml", help="workflow config YAML")
        return sp

    sp = with_config(sub.add_parser("validate", help="validate the config and the scene sheet"))
    sp.set_defaults(func=cmd_validate)

    sp = sub.add_parser("demo-scenes", help="write the bundled procedural demo scenes")
    sp.add_argument("outdir", help="folder that receives <name>/scene.glb, obj_<i>.glb, ...")
    sp.add_argument("--names", nargs="+", help="which demo scenes (default: all)")
    sp.add_argument("--frame-num", type=int, default=41, help="frames of the scripted motion")
    sp.set_defaults(func=cmd_demo_scenes)

    for name, func, helptext in (
        ("ingest", cmd_ingest, "normalise a scene: scene.json and meshes"),
        ("gaussians", cmd_gaussians, "build or import each object's Gaussians"),
        ("voxelize", cmd_voxelize, "voxel sets and control points of dynamic objects"),
    ):
        sp = with_config(sub.add_parser(name, help=helptext))
        sp.add_argument("--scene", required=True, help="scene id from the sheet")
        if name != "ingest":
            sp.add_argument("--obj", nargs="+", help="objects (default: all that apply)")
        sp.set_defaults(func=func)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:  # CHORD's train.py flags, parsed by chord.train_cli
        return _train(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.func(args)
    except (cfg.ConfigError, SceneError, ValueError, FileNotFoundError) as exc:
        print(f"chord {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT


def _train(argv: list[str]) -> int:
    from chord import train_cli

    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from chord.train import Interrupted

    try:
        return train_cli.run(argv)
    except Interrupted as exc:
        print(f"chord train: {exc}; rerun the same command to resume", file=sys.stderr)
        return Interrupted.exit_code
    except (cfg.ConfigError, SceneError, ValueError, FileNotFoundError) as exc:
        print(f"chord train: error: {exc}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())

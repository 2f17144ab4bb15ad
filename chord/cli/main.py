"""The ``chord`` command. Each stage subcommand calls the same ``chord.stages.<stage>.run`` as
the Snakemake rule, with the same paths, so a scene can be prepared without Snakemake."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chord.config import settings as cfg
from chord.core.errors import InputError
from chord.plan import results_layout
from chord.scene import ingestion

logger = logging.getLogger("chord")

EXIT_INPUT = 2  # bad configuration or scene input
# commands that read files only: torch is not imported (chord status on a login node)
TORCH_FREE = (["status"],)


def _load(args) -> cfg.Config:
    return cfg.load_file(Path(args.config))


def _spec(conf: cfg.Config, scene: str) -> cfg.SceneSpec:
    if scene not in conf.scenes:
        raise cfg.ConfigError(f"--scene: {scene!r} is not in the scene sheet {sorted(conf.scenes)}")
    return conf.scenes[scene]


def _objects(args, keep) -> tuple[cfg.Config, cfg.SceneSpec, list[str]]:
    """The config, the --scene's spec and the objects a per-object stage runs on: --obj, else
    those whose role (in the scene's ingested scene.json) ``keep`` accepts."""
    conf = _load(args)
    spec = _spec(conf, args.scene)
    doc = ingestion.read_scene_json(results_layout.scene_json(conf.results, spec.scene))
    roles = {o["name"]: o["role"] for o in doc["objects"]}
    return conf, spec, args.obj or [o for o, r in roles.items() if keep(r)]


def cmd_build_kernels(args) -> int:
    """gsplat's kernels built for this node's GPU and launched on it (exit 2 when they cannot
    be: no CUDA GPU, no toolkit, a failed build or launch)."""
    from chord.checks import gpu, report

    checks = gpu.build_kernels(rebuild=args.rebuild)
    print(report.table(checks))
    return EXIT_INPUT if report.failures(checks) else 0


def cmd_validate(args) -> int:
    """The config, the sheet, and each scene's data as ingest and training will read it (exit 2
    naming every problem found)."""
    from chord.checks import scene_data

    conf = cfg.load_file(Path(args.config), *(Path(p) for p in args.configfile))
    problems = []
    for name, spec in conf.scenes.items():
        found, warnings = scene_data.scene_problems(spec, conf)
        for line in warnings:
            print(f"warning: {line}", file=sys.stderr)
        problems.extend(found)
        status = "ok" if not found else f"{len(found)} problem(s)"
        seeds = f"\tseeds={','.join(map(str, spec.seeds))}" if spec.seeds else ""
        print(f"{name}\t{spec.data}\ttier={spec.tier}{seeds}\t{status}\t{spec.prompt}")
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems:
        print(
            f"config {args.config}: {len(problems)} problem(s) in the scenes' data",
            file=sys.stderr,
        )
        return EXIT_INPUT
    print(f"config {args.config}: {len(conf.scenes)} scene(s) valid", file=sys.stderr)
    return 0


def cmd_doctor(args) -> int:
    """Every check of :mod:`chord.checks.doctor` for the config (exit 2 when one fails)."""
    import os

    from chord.checks import doctor, report

    conf = cfg.load_file(Path(args.config), *(Path(p) for p in args.configfile))
    if args.trace:  # the faked trace instead of this machine's checks
        from chord.checks import trace

        return 0 if trace.main(conf, Path(args.config), args.configfile) else EXIT_INPUT
    checks = doctor.run(conf, os.environ)
    print(report.table(checks))
    counts = {s: sum(c.status == s for c in checks) for s in (report.PASS, report.FAIL, report.NA)}
    print(
        f"chord doctor: {counts['pass']} pass, {counts['fail']} fail, {counts['n/a']} n/a",
        file=sys.stderr,
    )
    return EXIT_INPUT if counts["fail"] else 0


def cmd_status(args) -> int:
    """Every run of the sheet: the stage done, state, progress, records, Slurm job; with
    ``--watch`` again every so many seconds until interrupted. Reads files only."""
    import time

    from chord.cli import status

    while True:
        conf = cfg.load_file(Path(args.config), *(Path(p) for p in args.configfile))
        rows = status.collect(conf)
        text = status.as_json(rows) if args.json else status.render(rows)
        if args.watch and sys.stdout.isatty():
            print("\033[H\033[2J", end="")  # a terminal: redraw in place
        print(text, flush=True)
        if not args.watch:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def cmd_demo_scenes(args) -> int:
    from chord.scene import demo

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
        out_json=results_layout.scene_json(conf.results, spec.scene),
        out_meshes=results_layout.meshes_dir(conf.results, spec.scene),
        method=spec.method,
        scene=spec.scene,
        mem_mb=args.mem_mb,
    )
    return 0


def cmd_gaussians(args) -> int:
    from chord.stages import gaussians

    conf, spec, objects = _objects(args, lambda role: role != "avoided")
    for obj in objects:
        gaussians.run(
            scene_json=results_layout.scene_json(conf.results, spec.scene),
            obj=obj,
            out=results_layout.gaussians_ply(conf.results, spec.scene, obj),
            method=spec.method,
            fitted=spec.gaussians,
        )
    return 0


def cmd_voxelize(args) -> int:
    from chord.stages import voxelize

    conf, spec, objects = _objects(args, lambda role: role == "dynamic")
    for obj in objects:
        voxelize.run(
            scene_json=results_layout.scene_json(conf.results, spec.scene),
            obj=obj,
            gaussians=results_layout.gaussians_ply(conf.results, spec.scene, obj),
            out=results_layout.voxels_npz(conf.results, spec.scene, obj),
            method=spec.method,
        )
    return 0


def cmd_evaluate(args) -> int:
    from chord.cli import upstream_train
    from chord.stages import evaluate

    conf = _load(args)
    spec = _spec(conf, args.scene)
    inputs = upstream_train.run_inputs(results_layout.scene_dir(conf.results, spec.scene))
    final = cfg.final_stage(spec.method)
    stages = ["coarse", "fine"] if final == "fine" else ["coarse"]
    motion = Path(spec.data) / "motion.json"
    out = evaluate.run(
        **inputs,
        state_path=results_layout.train_state(conf.results, spec.scene, final),
        ref_png=results_layout.reference_png(conf.results, spec.scene),
        loss_logs={st: results_layout.train_losses(conf.results, spec.scene, st) for st in stages},
        motion_json=motion if motion.is_file() else None,
        method=spec.method,
        out_json=results_layout.metrics_json(conf.results, spec.scene),
        out_frame0=results_layout.frame0_png(conf.results, spec.scene),
        out_losses=results_layout.loss_png(conf.results, spec.scene),
        out_interaction=results_layout.interaction_png(conf.results, spec.scene),
    )
    print(results_layout.metrics_json(conf.results, spec.scene))
    logger.debug("%s", out)
    return 0


def _run_folder(args) -> Path:
    root = Path(args.model_path) / args.ex_name
    if not root.is_dir():
        raise InputError(f"-m/--ex_name: run folder {root} does not exist")
    return root


def cmd_render(args) -> int:
    from chord.cli import upstream_train

    d = cfg.method_from_mapping({})  # the method defaults (METHOD §20)
    w, h = cfg.parse_size(d.size, where="size")
    out = upstream_train.render_run(
        _run_folder(args),
        checkpoint=args.checkpoint,
        width=args.image_width or w,
        height=args.image_height or h,
        azim=d.azim_l if args.azim is None else args.azim,
        elev=d.elev_l if args.elev is None else args.elev,
        cam_radius=d.cam_radius if args.cam_radius is None else args.cam_radius,
        cam_height=d.cam_height if args.cam_height is None else args.cam_height,
        fovy=d.fovy if args.fovy is None else args.fovy,
        fps=args.save_fps or d.save_fps,
        invert_bg_prob=d.invert_bg_prob if args.invert_bg_prob is None else args.invert_bg_prob,
        no_bg=args.no_bg,
        **_frames_and_objects(args),
    )
    print(out)
    return 0


def cmd_export_glb(args) -> int:
    from chord.cli import upstream_train

    if args.mesh_source_path is None:
        raise InputError("--mesh_source_path: required (the scene folder with obj_<i>.glb)")
    out = upstream_train.export_glb_run(
        _run_folder(args),
        mesh_source_path=Path(args.mesh_source_path),
        checkpoint=args.checkpoint,
        fps=args.save_fps or 12,  # METHOD §20: save_fps, else 12
        exclude_plane=args.exclude_plane,
        skinned=args.skinned,
        **_frames_and_objects(args),
    )
    print(out)
    return 0


#: the export flags both commands pass on as given: the frames and which objects move or show
FRAMES_AND_OBJECTS = ("lst_frame", "static_id", "exclude_objs", "additional_static_objs")


def _frames_and_objects(args) -> dict:
    return {name: getattr(args, name) for name in FRAMES_AND_OBJECTS}


def _export_flags(sp: argparse.ArgumentParser, *, glb: bool) -> None:
    """CHORD's render_scene.py / save_dynamic_scene_glb.py flags (METHOD §20)."""
    sp.add_argument(
        "-m", "--model_path", "--model", dest="model_path", required=True, help="output root"
    )
    sp.add_argument("--ex_name", default="default", help="run folder under -m (default: default)")
    sp.add_argument(
        "--mesh_source_path",
        help="scene folder with obj_<i>.glb"
        + (" (the source meshes that are animated)" if glb else " (accepted; not needed)"),
    )
    sp.add_argument(
        "--checkpoint", type=int, default=-1, help="iteration to export; -1 = the latest"
    )
    sp.add_argument("--save_fps", type=int, help="frame rate" + (" (default 12)" if glb else ""))
    sp.add_argument("--lst_frame", type=int, default=-1, help="export frames t < lst_frame")
    sp.add_argument("--static_id", type=int, help="checked against the run's static object")
    sp.add_argument("--exclude_objs", nargs="*", default=[], help="objects left out")
    sp.add_argument("--additional_static_objs", nargs="*", default=[], help="objects held at rest")
    if glb:
        sp.add_argument(
            "--exclude_plane",
            action="store_true",
            help="use <mesh_source_path>/static_obj.glb for the static object",
        )
        sp.add_argument(
            "--skinned",
            action="store_true",
            help="write dynamic_scene_skinned.glb: a skin on the control points (ours)",
        )
        return
    sp.add_argument("--image_width", type=int, help="default: the method size's width")
    sp.add_argument("--image_height", type=int, help="default: the method size's height")
    sp.add_argument("--azim", type=float, help="camera azimuth in degrees (default azim_l)")
    sp.add_argument("--elev", type=float, help="camera elevation in degrees (default elev_l)")
    sp.add_argument("--cam_radius", type=float, help="camera distance (default 2.0)")
    sp.add_argument("--cam_height", type=float, help="height of the camera target (default 0)")
    sp.add_argument("--fovy", type=float, help="vertical field of view (default 49.1)")
    sp.add_argument(
        "--invert_bg_prob", type=float, help="> 0: black background, else white (default -1)"
    )
    sp.add_argument("--no_bg", action="store_true", help="omit the static objects")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chord", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="CHORD train.py flags (see `chord train --help`)", add_help=False)

    def with_config(sp):
        sp.add_argument("--config", default="config/config.yaml", help="workflow config YAML")
        return sp

    def with_configfiles(sp):
        sp.add_argument(
            "--configfile",
            action="append",
            default=[],
            help="a config file merged over --config, as snakemake --configfile does (repeatable)",
        )
        return sp

    sp = with_configfiles(
        with_config(
            sub.add_parser(
                "validate",
                help="validate the config, the scene sheet and each scene's data as ingest "
                "and training will read it",
            )
        )
    )
    sp.set_defaults(func=cmd_validate)

    sp = with_config(
        sub.add_parser(
            "doctor",
            help="preflight on the GPU node before a long run: CUDA, gsplat, the Wan folder, "
            "the Tiny VAE file, memory against the model, the allocator, disk",
        )
    )
    with_configfiles(sp)
    sp.add_argument(
        "--trace",
        action="store_true",
        help="instead: run each tier's training iteration at the config's real shapes on a faked "
        "CUDA device (no GPU needed: a login node, a laptop; torch's CPU build) and print its "
        "traced peak memory beside the model's and the tier's card",
    )
    sp.set_defaults(func=cmd_doctor)

    sp = with_configfiles(
        with_config(
            sub.add_parser(
                "status",
                help="where every run of the sheet stands: stage done, state (done, running, "
                "stalled, failed, waiting), iteration, s/it, ETA, losses, tier, records, the "
                "failing log, the Slurm job; reads files only",
            )
        )
    )
    sp.add_argument("--json", action="store_true", help="the same as JSON")
    sp.add_argument(
        "--watch", type=float, metavar="SECONDS", help="print it again every SECONDS (Ctrl-C ends)"
    )
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser(
        "build-kernels",
        help="build gsplat's CUDA kernels for this node's GPU kind (once; jobs that start "
        "while it builds wait for it) and launch them on the card",
    )
    sp.add_argument("--rebuild", action="store_true", help="delete this card's build first")
    sp.set_defaults(func=cmd_build_kernels)

    sp = sub.add_parser("demo-scenes", help="write the bundled procedural demo scenes")
    sp.add_argument("outdir", help="folder that receives <name>/scene.glb, obj_<i>.glb, ...")
    sp.add_argument("--names", nargs="+", help="which demo scenes (default: all)")
    sp.add_argument("--frame-num", type=int, default=41, help="frames of the scripted motion")
    sp.set_defaults(func=cmd_demo_scenes)

    sp = sub.add_parser(
        "render", help="render a chord train run from one camera (CHORD's render_scene.py)"
    )
    _export_flags(sp, glb=False)
    sp.set_defaults(func=cmd_render)

    sp = sub.add_parser(
        "export-glb",
        help="animated dynamic_scene.glb of a chord train run (CHORD's save_dynamic_scene_glb.py)",
    )
    _export_flags(sp, glb=True)
    sp.set_defaults(func=cmd_export_glb)

    for name, func, helptext in (
        ("ingest", cmd_ingest, "normalise a scene: scene.json and meshes"),
        ("gaussians", cmd_gaussians, "build or import each object's Gaussians"),
        ("voxelize", cmd_voxelize, "voxel sets and control points of dynamic objects"),
        ("evaluate", cmd_evaluate, "metrics.json, loss and frame-0 plots of a trained scene"),
    ):
        sp = with_config(sub.add_parser(name, help=helptext))
        sp.add_argument("--scene", required=True, help="scene id from the sheet")
        if name not in ("ingest", "evaluate"):
            sp.add_argument("--obj", nargs="+", help="objects (default: all that apply)")
        if name == "ingest":
            sp.add_argument(
                "--mem-mb",
                type=int,
                help="memory budget of the scene's reads in MB: a file whose estimated peak "
                "exceeds it is refused (default $CHORD_MEM_MB, else the ingest rule's 8000)",
            )
        sp.set_defaults(func=func)
    return p


def main(argv: list[str] | None = None) -> int:
    import os

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] not in TORCH_FREE:  # chord.resources.cuda_settings imports torch
        from chord.resources import cuda_settings

        cuda_settings.configure_allocator(os.environ)  # before anything starts CUDA (METHOD §15)
    if argv[:1] == ["train"]:  # CHORD's train.py flags, parsed by chord.cli.upstream_train
        return _train(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.func(args)
    except (InputError, FileNotFoundError) as exc:  # bad input; anything else is a bug
        print(f"chord {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT


def _train(argv: list[str]) -> int:
    from chord.cli import upstream_train

    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from chord.training.run_loop import Interrupted

    try:
        return upstream_train.train(argv)
    except Interrupted as exc:
        print(f"chord train: {exc}; rerun the same command to resume", file=sys.stderr)
        return Interrupted.exit_code
    except (InputError, FileNotFoundError) as exc:  # bad input; anything else is a bug
        print(f"chord train: error: {exc}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())

"""One scene's plan, decided once and without torch: the files ingest reads, the objects by
role, the training stages, and each stage's input and output files. The Snakefile's rules and
targets, ``chord doctor`` and ``chord validate`` walk the same plans (:func:`scene`).

Snakemake's named inputs are flat (``ply_obj_0``); the adapters read them back as records
(``plys: {obj_0: path}``). :func:`named` and :func:`record` are that translation, both ways,
defined once (:data:`KEYED`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from chord.config import settings
from chord.plan import results_layout
from chord.scene import demo, ingestion

MOTION = "motion.json"  # a scene's scripted motion (chord.motion.scripted)
STAGES = ("coarse", "fine")  # the training stages, in run order (fine: a second layer)

#: A record's per-object (or per-stage, per-scene) mappings and their flat name prefix.
KEYED = {
    "plys": "ply_",
    "voxels": "vox_",
    "sources": "src_",
    "loss_logs": "losses_",
    "metrics": "metrics_",
    "videos": "video_",
}


def named(record: Mapping) -> dict:
    """Snakemake's named inputs of ``record``: each :data:`KEYED` mapping flattened to
    ``<prefix><key>``, other entries (a path, a list of paths) as they are, every path a str."""
    out = {}
    for key, value in record.items():
        if key in KEYED:
            out.update({f"{KEYED[key]}{k}": str(v) for k, v in value.items()})
        elif isinstance(value, list | tuple):
            out[key] = [str(v) for v in value]
        else:
            out[key] = str(value)
    return out


def record(inputs: Mapping | Iterable[tuple[str, object]]) -> dict:
    """The inverse of :func:`named`, paths as :class:`~pathlib.Path`: what an adapter passes on
    (``inputs``: a mapping, or (name, value) pairs such as ``snakemake.input.items()``). Every
    :data:`KEYED` mapping is present (empty where the job has none)."""
    out = {key: {} for key in KEYED}
    for name, value in inputs.items() if isinstance(inputs, Mapping) else inputs:
        keyed = next((k for k, prefix in KEYED.items() if name.startswith(prefix)), None)
        if keyed:
            out[keyed][name[len(KEYED[keyed]) :]] = Path(value)
        elif isinstance(value, str | Path):
            out[name] = Path(value)
        else:  # a list of files (Snakemake's Namedlist)
            out[name] = [Path(v) for v in value]
    return out


def demo_name(spec: settings.SceneSpec, demo_dir: Path) -> str | None:
    """The bundled demo scene a sheet row points at (data = <demo_dir>/<name>), else None."""
    data = Path(spec.data)
    if data.parent == Path(demo_dir) and data.name in demo.DEMO_SCENES:
        return data.name
    return None


def motion_problem(spec: settings.SceneSpec, backend: str, demo_dir: Path) -> str | None:
    """Why the scene cannot train with the teacher ``backend``: the oracle distils a scripted
    ``motion.json``, which one's own scene does not have. None when it can."""
    if backend != "oracle" or demo_name(spec, demo_dir):
        return None
    motion = Path(spec.data) / MOTION
    if motion.is_file():
        return None
    return (
        f"scene {spec.scene} ({spec.where}): the teacher is the oracle (guidance.backend: oracle, "
        f"the default), which distils a scripted motion, and {motion} does not exist. To "
        "animate the scene from its prompt, set guidance.backend: wan with guidance.ckpt_dir "
        "(a local Wan2.2-I2V-A14B-Diffusers folder) and guidance.tiny_vae_path (see "
        "docs/wan-teacher.md); or add a motion.json (format chord-scripted-motion/1, "
        "chord/motion/scripted.py) to distil a scripted motion"
    )


def scene_files(spec: settings.SceneSpec, demo_dir: Path) -> tuple[str, ...]:
    """What ingest reads of a scene: the demo registry's GLBs (written by the workflow), or the
    folder's scene and object files (.glb, or .gltf with the files it refers to)."""
    data = Path(spec.data)
    name = demo_name(spec, demo_dir)
    if name:
        return tuple(str(data / f) for f in demo.demo_files(name) if f.endswith(".glb"))
    return tuple(str(p) for p in ingestion.data_files(data))


def object_ids(files) -> list[int]:
    """The object ids of a scene's files (``obj_<i>.glb|gltf``), sorted."""
    return sorted(int(m[1]) for f in files if (m := ingestion.OBJ_FILE.match(Path(f).name)))


@dataclass(frozen=True)
class ScenePlan:
    """A scene's jobs: what each reads and writes. ``roles`` is empty where the files do not
    give contiguous object ids (ingest reports that, naming the files)."""

    scene: str
    results: Path
    data: Path
    demo: str | None
    files: tuple[str, ...]
    roles: Mapping[str, str]
    stages: tuple[str, ...]
    teacher: str  # guidance.backend
    motion_problem: str | None  # why the oracle cannot train it (no motion.json), else None
    seeds: tuple[int, ...] = ()  # a seed sweep's seeds (the sheet's or sweep.seeds); ()
    seed: int | None = None  # one run of a sweep (:meth:`runs`): its seed

    @property
    def run(self) -> str:
        """The name of this plan's run: the scene, or ``<scene>/seed_<s>`` (paths.run_name)
        for one seed of a sweep. Training and everything after it are per run."""
        return results_layout.run_name(self.scene, self.seed)

    @property
    def swept(self) -> bool:
        return bool(self.seeds)

    def runs(self) -> list[ScenePlan]:
        """The scene's runs: one per seed of a sweep, else the scene's one run (itself)."""
        if not self.seeds or self.seed is not None:
            return [self]
        return [dataclasses.replace(self, seed=s) for s in self.seeds]

    def for_run(self, run: str) -> ScenePlan:
        """The plan of ``run``, one of :meth:`runs` (a ConfigError otherwise)."""
        for plan in self.runs():
            if plan.run == run:
                return plan
        runs = settings.few(p.run for p in self.runs())
        raise settings.ConfigError(f"scene {self.scene}: {run!r} is not one of its runs ({runs})")

    @property
    def kept(self) -> list[str]:
        """The objects that are not avoided: each has Gaussians."""
        return [obj for obj, role in self.roles.items() if role != "avoided"]

    @property
    def dynamic(self) -> list[str]:
        return [obj for obj, role in self.roles.items() if role == "dynamic"]

    @property
    def final_stage(self) -> str:
        return self.stages[-1]

    def gaussians(self) -> dict[str, Path]:
        return {
            obj: results_layout.gaussians_ply(self.results, self.scene, obj) for obj in self.kept
        }

    def voxels(self) -> dict[str, Path]:
        return {
            obj: results_layout.voxels_npz(self.results, self.scene, obj) for obj in self.dynamic
        }

    def loss_logs(self) -> dict[str, Path]:
        """{training stage: loss log}, in run order."""
        return {st: results_layout.train_losses(self.results, self.run, st) for st in self.stages}

    def final_state(self) -> Path:
        return results_layout.train_state(self.results, self.run, self.final_stage)

    def scripted_motion(self) -> Path | None:
        """The scene's scripted ground-truth motion.json (the demo's, or one in its folder)."""
        path = self.data / MOTION
        return path if self.demo or path.is_file() else None

    def teacher_motion(self) -> dict:
        """The motion.json the oracle teacher distils ({} for the Wan teacher); a scene
        without one is a ConfigError naming the sheet row and the remedies."""
        if self.teacher != "oracle":
            return {}
        if self.motion_problem:
            raise settings.ConfigError(self.motion_problem)
        return {"motion": self.data / MOTION}

    # -- each stage's inputs (records: :func:`named` flattens them for Snakemake) --

    def ingest_inputs(self) -> dict:
        return {"data": list(self.files)}

    def geometry_inputs(self) -> dict:
        """What gaussians and voxelize read: scene.json and the normalised meshes."""
        return {
            "scene_json": results_layout.scene_json(self.results, self.scene),
            "meshes": results_layout.meshes_dir(self.results, self.scene),
        }

    def reference_inputs(self) -> dict:
        return {
            "scene_json": results_layout.scene_json(self.results, self.scene),
            "plys": self.gaussians(),
        }

    def train_inputs(self) -> dict:
        """scene.json, every Gaussian set, the dynamic objects' voxels, the text embeddings,
        and the oracle's motion.json."""
        return {
            "scene_json": results_layout.scene_json(self.results, self.scene),
            "text": results_layout.text_condition(self.results, self.scene),
            "plys": self.gaussians(),
            "voxels": self.voxels(),
            **self.teacher_motion(),
        }

    def trained_inputs(self) -> dict:
        """What export and evaluate read: scene.json, the Gaussians, the dynamic objects'
        voxels and the final training state."""
        return {
            "scene_json": results_layout.scene_json(self.results, self.scene),
            "state": self.final_state(),
            "plys": self.gaussians(),
            "voxels": self.voxels(),
        }

    def export_inputs(self) -> dict:
        """trained_inputs plus each exported object's source glTF and the files those refer
        to (``external``: a .gltf's buffers and images)."""
        sources, external = {}, []
        for f in self.files:
            m = ingestion.OBJ_FILE.match(Path(f).name)
            if m is None:
                if not ingestion.is_scene_file(f):
                    external.append(f)
            elif self.roles.get(f"obj_{m[1]}", "avoided") != "avoided":
                sources[f"obj_{m[1]}"] = f
        return {**self.trained_inputs(), "sources": sources, "external": external}

    def evaluate_inputs(self) -> dict:
        """trained_inputs plus the normalised meshes (the interaction checks), ref.png, the
        loss logs and the scripted motion if any."""
        motion = self.scripted_motion()
        return {
            **self.trained_inputs(),
            "meshes": results_layout.meshes_dir(self.results, self.scene),
            "ref": results_layout.reference_png(self.results, self.scene),
            "loss_logs": self.loss_logs(),
            **({"motion": motion} if motion else {}),
        }

    def preview_inputs(self) -> dict:
        """scene.json, every Gaussian set, the reference render, the text embeddings, and
        the oracle's motion.json."""
        return {
            "scene_json": results_layout.scene_json(self.results, self.scene),
            "ref": results_layout.reference_png(self.results, self.scene),
            "text": results_layout.text_condition(self.results, self.scene),
            "plys": self.gaussians(),
            **self.teacher_motion(),
        }

    def sweep_inputs(self) -> dict:
        """Each seed's reference-camera video and metrics.json (keyed by seed)."""
        runs = {str(p.seed): p for p in self.runs()}
        return {
            "videos": {k: results_layout.ref_view_mp4(p.results, p.run) for k, p in runs.items()},
            "metrics": {k: results_layout.metrics_json(p.results, p.run) for k, p in runs.items()},
        }

    def run_targets(self) -> list[Path]:
        """What the default target makes of this run: training, exports, viewer, metrics."""
        r, run = self.results, self.run
        return [
            self.final_state(),
            results_layout.ref_view_mp4(r, run),
            results_layout.orbit_mp4(r, run),
            *[results_layout.fixed_view_mp4(r, run, v) for v in results_layout.FIXED_VIEWS],
            results_layout.preview_gif(r, run),
            results_layout.dynamic_glb(r, run),
            results_layout.dynamic_skinned_glb(r, run),
            results_layout.dynamic_splats_glb(r, run),
            results_layout.dynamic_splats_rigid_glb(r, run),
            results_layout.trajectories_npz(r, run),
            results_layout.trajectories_json(r, run),
            results_layout.scene_usda(r, run),
            results_layout.viewer_html(r, run),
            results_layout.splats_html(r, run),
            results_layout.ply_sequence_dir(r, run),
            results_layout.metrics_json(r, run),
        ]

    def targets(self) -> list[str]:
        """Every file the workflow's default target makes of this scene: the shared stages'
        once, each run's, and a sweep's comparison and choice."""
        r, s = self.results, self.scene
        files = [
            results_layout.scene_json(r, s),
            results_layout.reference_png(r, s),
            results_layout.text_condition(r, s),
            *self.gaussians().values(),
            *self.voxels().values(),
        ]
        for run in self.runs():
            files += run.run_targets()
        if self.swept:
            files += [
                results_layout.sweep_png(r, s),
                results_layout.sweep_tsv(r, s),
                results_layout.best_json(r, s),
            ]
        return [str(f) for f in files]


def run_spec(conf: settings.Config, run: str) -> settings.SceneSpec:
    """The scene spec of ``run`` (a scene, or ``<scene>/seed_<s>``): a sweep's run trains
    with its own seed."""
    scene, seed = results_layout.run_parts(run)
    spec = conf.scenes[scene]
    if seed is None:
        return spec
    if seed not in spec.seeds:
        raise settings.ConfigError(
            f"scene {scene}: seed {seed} is not one of its seeds {spec.seeds}"
        )
    return dataclasses.replace(spec, method=dataclasses.replace(spec.method, seed=seed))


def scene(conf: settings.Config, name: str) -> ScenePlan:
    """The plan of the sheet row ``name`` of ``conf``. Reads the scene folder's file names
    (not their contents). A ``static_id`` or object list outside the objects is a
    ConfigError naming the scene."""
    spec = conf.scenes[name]
    files = scene_files(spec, conf.demo_dir)
    ids = object_ids(files)
    roles = {}
    if ids and ids == list(range(len(ids))):
        try:
            roles = settings.object_roles(spec.method, len(ids))
        except settings.ConfigError as exc:
            raise settings.ConfigError(f"scene {name}: {exc}") from None
    final = settings.final_stage(spec.method)
    return ScenePlan(
        scene=name,
        results=Path(conf.results),
        data=Path(spec.data),
        demo=demo_name(spec, conf.demo_dir),
        files=files,
        roles=roles,
        stages=STAGES[: STAGES.index(final) + 1],
        teacher=conf.guidance.backend,
        motion_problem=motion_problem(spec, conf.guidance.backend, conf.demo_dir),
        seeds=spec.seeds,
    )


def runs(plans: Mapping[str, ScenePlan]) -> list[ScenePlan]:
    """Every run of the scenes, in sheet and seed order."""
    return [run for p in plans.values() for run in p.runs()]


def aggregate_inputs(plans: Mapping[str, ScenePlan]) -> dict:
    """Every run's metrics.json and loss logs (``losses_<run>_<stage>``)."""
    return {
        "metrics": {p.run: results_layout.metrics_json(p.results, p.run) for p in runs(plans)},
        "loss_logs": {
            f"{p.run}_{st}": path for p in runs(plans) for st, path in p.loss_logs().items()
        },
    }


def all_targets(plans: Mapping[str, ScenePlan], results: Path) -> list[str]:
    """The workflow's default target: every scene's files, then the cross-scene table and
    plots."""
    targets = [t for p in plans.values() for t in p.targets()]
    if plans:
        targets += [
            str(results_layout.metrics_tsv(results)),
            str(results_layout.metrics_png(results)),
            str(results_layout.losses_png(results)),
        ]
    return targets

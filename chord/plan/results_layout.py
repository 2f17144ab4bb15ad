"""The output layout under ``results/`` (DESIGN §3). Users and later stages script against
these names. Called with ``"{scene}"``/``"{obj}"`` they give the Snakemake patterns."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache  # the DAG build asks ~50 times per scene (bench/dag.py); a Path is immutable
def scene_dir(results, scene: str) -> Path:
    return Path(results) / scene


# -- seed sweeps: a scene trained with several seeds has one run per seed, each with its own
# training, checkpoints, exports and evaluation under results/<scene>/seed_<s>/ (every stage
# before training is the scene's, shared). The trained side's path functions take a run name
# where they take a scene: an unswept scene's one run is the scene itself.

SEED_DIR = "seed_"
#: a run name as a regex (the workflow's `run` wildcard): a scene id, or <scene>/seed_<s>
RUN_PATTERN = r"[A-Za-z0-9_-]+(?:/seed_\d+)?"


def run_name(scene: str, seed: int | None) -> str:
    """The run of ``scene`` with ``seed`` (None: the scene's one unswept run)."""
    return scene if seed is None else f"{scene}/{SEED_DIR}{seed}"


def run_parts(run: str) -> tuple[str, int | None]:
    """The inverse of :func:`run_name`: (scene, seed or None)."""
    scene, _, seed = run.partition(f"/{SEED_DIR}")
    return scene, int(seed) if seed else None


def scene_json(results, scene: str) -> Path:
    return scene_dir(results, scene) / "scene" / "scene.json"


def meshes_dir(results, scene: str) -> Path:
    return scene_dir(results, scene) / "scene" / "meshes"


def gaussians_ply(results, scene: str, obj: str) -> Path:
    return scene_dir(results, scene) / "gaussians" / f"{obj}.ply"


def voxels_npz(results, scene: str, obj: str) -> Path:
    return scene_dir(results, scene) / "voxels" / f"{obj}.npz"


def log(results, scene: str, name: str) -> Path:
    return scene_dir(results, scene) / "logs" / f"{name}.log"


def bench(results, scene: str, name: str) -> Path:
    return scene_dir(results, scene) / "bench" / f"{name}.tsv"


def reference_png(results, scene: str) -> Path:
    return scene_dir(results, scene) / "reference" / "ref.png"


def static_orbit_mp4(results, scene: str) -> Path:
    return scene_dir(results, scene) / "reference" / "static_orbit.mp4"


def text_condition(results, scene: str) -> Path:
    return scene_dir(results, scene) / "condition" / "text.safetensors"


def train_state(results, scene: str, stage: str) -> Path:
    return scene_dir(results, scene) / "train" / f"{stage}.pt"


def train_losses(results, scene: str, stage: str) -> Path:
    return scene_dir(results, scene) / "train" / f"{stage}_losses.tsv"


def previews_dir(results, scene: str) -> Path:
    """A training's live previews (``it_<i>.mp4``, ``latest.mp4``): outside the rules' outputs."""
    return scene_dir(results, scene) / "train" / "previews"


def checkpoints(results, scene: str, stage: str) -> Path:
    """Resume checkpoints: kept outside the rules' declared outputs (DESIGN §3)."""
    return scene_dir(results, scene) / "checkpoints" / stage


# -- export, evaluate, aggregate (METHOD §19–§20) -------------------------------------------

FIXED_VIEWS = {"front": 0.0, "right": 90.0, "back": 180.0, "left": 270.0}  # name -> azimuth


def export_dir(results, scene: str) -> Path:
    return scene_dir(results, scene) / "export"


def ref_view_mp4(results, scene: str) -> Path:
    """Every frame from the reference camera."""
    return export_dir(results, scene) / "ref_view.mp4"


def orbit_mp4(results, scene: str) -> Path:
    """The animation while the camera circles the scene once."""
    return export_dir(results, scene) / "orbit.mp4"


def fixed_view_mp4(results, scene: str, view: str) -> Path:
    """The animation from one of :data:`FIXED_VIEWS` (front, right, back, left)."""
    return export_dir(results, scene) / "views" / f"{view}.mp4"


def preview_gif(results, scene: str) -> Path:
    return export_dir(results, scene) / "preview.gif"


def dynamic_glb(results, scene: str) -> Path:
    """The source meshes with one morph target per frame (CHORD's dynamic_scene.glb)."""
    return export_dir(results, scene) / "dynamic_scene.glb"


def dynamic_skinned_glb(results, scene: str) -> Path:
    """The source meshes skinned on their control points (one joint each), keyed per frame."""
    return export_dir(results, scene) / "dynamic_scene_skinned.glb"


def dynamic_splats_glb(results, scene: str) -> Path:
    """The trained Gaussians (KHR_gaussian_splatting), skinned on the same joints and keys."""
    return export_dir(results, scene) / "dynamic_splats.glb"


def dynamic_splats_rigid_glb(results, scene: str) -> Path:
    """The trained Gaussians with node animation only (rigid poses): any splat viewer plays it."""
    return export_dir(results, scene) / "dynamic_splats_rigid.glb"


def trajectories_npz(results, scene: str) -> Path:
    """Each dynamic object's rigid pose per frame, its fit residual and control-point tracks."""
    return export_dir(results, scene) / "trajectories.npz"


def trajectories_json(results, scene: str) -> Path:
    """The sidecar of trajectories.npz: units, axes, the normalisation, what each array holds."""
    return export_dir(results, scene) / "trajectories.json"


def scene_usda(results, scene: str) -> Path:
    """The animated scene as USD (Z-up, metres): rigid poses on Xforms, UsdSkel or points."""
    return export_dir(results, scene) / "scene.usda"


def scene_splats_usd(results, scene: str) -> Path:
    """The trained Gaussians as USD, a layer scene.usda sublayers (text or crate by size)."""
    return export_dir(results, scene) / "splats.usd"


def viewer_html(results, scene: str) -> Path:
    """The scene's 3D viewer: one self-contained page playing its skinned GLB."""
    return export_dir(results, scene) / "viewer.html"


def splats_html(results, scene: str) -> Path:
    """The scene's splat player: one self-contained page playing its dynamic_splats.glb."""
    return export_dir(results, scene) / "splats.html"


def ply_sequence_dir(results, scene: str) -> Path:
    """Per-frame 3DGS PLYs ``frame_<t>.ply`` of the whole scene."""
    return export_dir(results, scene) / "ply"


def metrics_json(results, scene: str) -> Path:
    return scene_dir(results, scene) / "metrics.json"


def eval_dir(results, scene: str) -> Path:
    return scene_dir(results, scene) / "eval"


def frame0_png(results, scene: str) -> Path:
    """ref.png, the frame-0 render and their difference side by side."""
    return eval_dir(results, scene) / "frame0_vs_ref.png"


def preview_strip_png(results, scene: str) -> Path:
    """The training's live previews, one row per previewed iteration (the report shows it)."""
    return eval_dir(results, scene) / "previews.png"


def loss_png(results, scene: str) -> Path:
    """The scene's loss curves from the training logs."""
    return eval_dir(results, scene) / "losses.png"


def sweep_dir(results, scene: str) -> Path:
    return scene_dir(results, scene) / "sweep"


def sweep_png(results, scene: str) -> Path:
    """A swept scene's seeds side by side: first, middle and last frames, and the metrics."""
    return sweep_dir(results, scene) / "seeds.png"


def sweep_tsv(results, scene: str) -> Path:
    """One row per seed of a swept scene: its metrics and whether the selection chose it."""
    return sweep_dir(results, scene) / "seeds.tsv"


def best_json(results, scene: str) -> Path:
    """The seed the config's selection rule chose, why, and its run's files."""
    return scene_dir(results, scene) / "best" / "selection.json"


def interaction_png(results, scene: str) -> Path:
    """Per frame and object pair: interpenetration (share inside, deepest) and floating."""
    return eval_dir(results, scene) / "interaction.png"


def metrics_tsv(results) -> Path:
    """One row per run (a scene, or a swept scene's seed)."""
    return Path(results) / "metrics.tsv"


def plots_dir(results) -> Path:
    return Path(results) / "plots"


def metrics_png(results) -> Path:
    """Bars of the main metrics across scenes."""
    return plots_dir(results) / "metrics.png"


def losses_png(results) -> Path:
    """Every scene's loss curves, one panel per scene."""
    return plots_dir(results) / "losses.png"


def results_log(results, name: str) -> Path:
    """Log of a rule over all scenes (aggregate)."""
    return Path(results) / "logs" / f"{name}.log"


def results_bench(results, name: str) -> Path:
    return Path(results) / "bench" / f"{name}.tsv"


def code_digest(root, stage: str) -> Path:
    """The sha256 of the chord sources ``stage`` depends on (rule code): its code input.
    ``root`` is shared by every results root (the workflow's ``resources``)."""
    return Path(root) / "code" / f"{stage}.sha256"


def teacher_mp4(results, scene: str) -> Path:
    """The teacher preview (``snakemake preview``): an image-to-video sample of the scene."""
    return scene_dir(results, scene) / "preview" / "teacher.mp4"


def teacher_png(results, scene: str) -> Path:
    """Its first, middle and last frames side by side."""
    return scene_dir(results, scene) / "preview" / "teacher.png"

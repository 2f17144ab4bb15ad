"""The output layout under ``results/`` (DESIGN §3). Users and later stages script against
these names. Called with ``"{scene}"``/``"{obj}"`` they give the Snakemake patterns."""

from __future__ import annotations

from pathlib import Path


def scene_dir(results, scene: str) -> Path:
    return Path(results) / scene


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


def checkpoints(results, scene: str, stage: str) -> Path:
    """Resume checkpoints: kept outside the rules' declared outputs (DESIGN §3)."""
    return scene_dir(results, scene) / "checkpoints" / stage

# Validation first, then the scene sheet, wildcard constraints, input functions and targets.
import re
from pathlib import Path

import pandas as pd
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

import chord
import chord.config as cc
import chord.demo as demo
import chord.gaussians
import chord.paths as P

validate(config, cc.CONFIG_SCHEMA)
try:
    _rows = cc.read_sheet(config["scenes"])
    validate(
        pd.DataFrame([{k: v for k, v in r.items() if k != "_line"} for r in _rows]),
        cc.SCENES_SCHEMA,
    )
    CONF = cc.load(config)
except cc.ConfigError as exc:
    raise WorkflowError(str(exc))

RESULTS = config["results"]
DEMO_DIR = config["demo_dir"]
SCENES = list(CONF.scenes)
PKG = Path(chord.__file__).parent

# A code change in a stage's modules re-runs that stage and what follows.
CODE = {
    "ingest": [PKG / "scene.py", PKG / "stages/ingest.py"],
    "gaussians": [PKG / "gaussians.py", PKG / "stages/gaussians.py"],
    "voxelize": [PKG / "voxels.py", PKG / "stages/voxelize.py"],
    "reference": [
        PKG / "cameras.py",
        PKG / "media.py",
        *sorted((PKG / "render").glob("*.py")),
        PKG / "stages/reference.py",
    ],
    "train": [
        PKG / "train.py",
        PKG / "optim.py",
        PKG / "rng.py",
        PKG / "losses.py",
        *sorted((PKG / "motion").glob("*.py")),
        *sorted((PKG / "guidance").glob("*.py")),
        *sorted((PKG / "render").glob("*.py")),
        PKG / "stages/train.py",
    ],
    "condition": [
        PKG / "guidance/text.py",
        PKG / "guidance/tiny_models.py",
        PKG / "stages/condition.py",
    ],
}


wildcard_constraints:
    scene="|".join(re.escape(s) for s in SCENES) or "(?!)",
    obj=r"obj_\d+",


def demo_name(scene):
    """The demo scene a sheet row points at (data = <demo_dir>/<name>), else None."""
    data = Path(CONF.scenes[scene].data)
    if data.parent == Path(DEMO_DIR) and data.name in demo.DEMO_SCENES:
        return data.name
    return None


def scene_files(scene):
    """scene.glb and obj_<i>.glb of a scene: from the demo registry, or what the folder holds."""
    data = Path(CONF.scenes[scene].data)
    name = demo_name(scene)
    if name:
        return [str(data / f) for f in demo.demo_files(name) if f.endswith(".glb")]
    found = sorted(data.glob("obj_*.glb"), key=lambda p: p.name)
    return [str(p) for p in [data / "scene.glb", *found] if p.is_file()]


def object_roles(scene):
    ids = sorted(
        int(m[1])
        for f in scene_files(scene)
        if (m := re.fullmatch(r"obj_(\d+)\.glb", Path(f).name))
    )
    if not ids or ids != list(range(len(ids))):
        return {}  # ingest reports the problem with the file names
    try:
        return cc.object_roles(CONF.scenes[scene].method, len(ids))
    except cc.ConfigError as exc:
        raise WorkflowError(f"scene {scene}: {exc}")


def stage_params(scene, stage):
    return cc.stage_params(CONF.scenes[scene].method, stage)


def condition_params(scene):
    """What changes a scene's text embeddings: the prompts and the encoder."""
    spec = CONF.scenes[scene]
    return {
        "prompt": spec.prompt,
        "n_prompt": spec.n_prompt,
        "encoder": CONF.guidance.ckpt_dir or "tiny",
        "t5_cpu": spec.method.t5_cpu,
    }


def code(stage):
    return [str(p) for p in CODE[stage]]


def ingest_inputs(wildcards):
    return {"data": scene_files(wildcards.scene), "code": code("ingest")}


def geometry_inputs(wildcards):
    return {
        "scene_json": str(P.scene_json(RESULTS, wildcards.scene)),
        "meshes": str(P.meshes_dir(RESULTS, wildcards.scene)),
    }


def fitted_ply(wildcards):
    folder = CONF.scenes[wildcards.scene].gaussians
    if folder is None:
        return []
    try:
        return [str(chord.gaussians.find_fitted_ply(Path(folder) / wildcards.obj))]
    except ValueError:
        return []  # the stage reports what is missing


def scene_plys(wildcards):
    """Every non-avoided object's Gaussians of a scene."""
    return {
        obj: str(P.gaussians_ply(RESULTS, wildcards.scene, obj))
        for obj, role in object_roles(wildcards.scene).items()
        if role != "avoided"
    }


def train_inputs(wildcards):
    """Everything a scene's training reads: scene.json, every Gaussian set, the dynamic
    objects' voxels, the text embeddings, and the oracle's motion.json when it applies.
    """
    scene = wildcards.scene
    roles = object_roles(scene)
    inputs = {
        "scene_json": str(P.scene_json(RESULTS, scene)),
        "text": str(P.text_condition(RESULTS, scene)),
    }
    for obj, role in roles.items():
        if role != "avoided":
            inputs[f"ply_{obj}"] = str(P.gaussians_ply(RESULTS, scene, obj))
        if role == "dynamic":
            inputs[f"vox_{obj}"] = str(P.voxels_npz(RESULTS, scene, obj))
    if CONF.guidance.backend == "oracle":
        inputs["motion"] = str(Path(CONF.scenes[scene].data) / "motion.json")
    return inputs


def train_params(scene):
    """The result-changing method values and guidance (memory flags are not params)."""
    import chord.stages.train as st

    return st.config_hash(CONF.scenes[scene].method, CONF.guidance)


def all_targets():
    targets = []
    for scene in SCENES:
        targets.append(str(P.scene_json(RESULTS, scene)))
        targets.append(str(P.reference_png(RESULTS, scene)))
        targets.append(str(P.text_condition(RESULTS, scene)))
        for obj, role in object_roles(scene).items():
            if role != "avoided":
                targets.append(str(P.gaussians_ply(RESULTS, scene, obj)))
            if role == "dynamic":
                targets.append(str(P.voxels_npz(RESULTS, scene, obj)))
    return targets

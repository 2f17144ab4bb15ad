# Validation first, then the scene sheet, wildcard constraints, input functions and targets.
import os

import pandas as pd
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

import chord
from chord.config import settings
import chord.scene.demo as demo
import chord.gltf.memory_budget
import chord.resources.gpus
import chord.resources.peak_memory
import chord.resources.job_memory
from chord.plan import results_layout
import chord.plan.scene_plan
import chord.config.sheet
import chord.plan.code_sources
from chord.resources import tiers
import chord.plan.workflow_jobs

validate(config, settings.CONFIG_SCHEMA)
DEBUG_SCENE = config["debug_scene"]
if DEBUG_SCENE:  # a debug run: one scene, the debug method values, its own results root
    if config["debug"]["results"] == config["results"]:
        raise WorkflowError("config: debug.results must differ from results")
    config["results"] = config["debug"]["results"]
    _over = config["scene_overrides"].get(DEBUG_SCENE, {})
    config["scene_overrides"][DEBUG_SCENE] = {**_over, **config["debug"]["method"]}
try:
    _rows = chord.config.sheet.read_sheet(config["scenes"])
    if DEBUG_SCENE and DEBUG_SCENE not in [r["scene"] for r in _rows]:
        raise settings.ConfigError(
            f"debug_scene: {DEBUG_SCENE!r} is not a scene of {config['scenes']}"
        )
    # the package's checks name the sheet's file and line; Snakemake's then see a valid sheet
    CONF = settings.load(config)
    validate(
        pd.DataFrame([{k: v for k, v in r.items() if k != "_line"} for r in _rows]),
        settings.SCENES_SCHEMA,
    )
    TIERS = tiers.parse(CONF.tiers)
except settings.ConfigError as exc:
    raise WorkflowError(str(exc))

RESULTS = config["results"]
# the ingest job's mem_mb: the budget of its reads (chord.gltf.memory_budget)
INGEST_MEM_MB = chord.gltf.memory_budget.INGEST_MEM_MB
DEMO_DIR = config["demo_dir"]
SCENES = [DEBUG_SCENE] if DEBUG_SCENE else list(CONF.scenes)
# A stage's code input is one file, the sha256 of the chord sources its result depends on
# (written by rules/code.smk). It lives beside the demo scenes, outside any results root, so
# production and debug runs share it: one code change is a change for both.
CODE_ROOT = "resources"
# stage -> its sources, found once per run and kept for the next (chord.plan.code_sources)
_CODE = {}


# The sheet's id pattern, not the list of ids: a 1000-name alternation in every output pattern
# makes the DAG build several times slower (bench/dag.py).
wildcard_constraints:
    scene=r"[A-Za-z0-9_-]+",
    # a scene's training and what follows it: <scene> or <scene>/seed_<s>
    run=results_layout.RUN_PATTERN,
    obj=r"obj_\d+",


_PLANS = {}


def plan(name):
    """The plan of a scene or of one run of it (chord.plan.scene_plan.scene): its files, objects by role,
    training stages and each stage's inputs and outputs, made once per workflow start.
    """
    if name not in _PLANS:
        scene, seed = results_layout.run_parts(name)
        try:
            if seed is None:
                _PLANS[name] = chord.plan.scene_plan.scene(CONF, scene)
            else:
                _PLANS[name] = plan(scene).for_run(name)
        except settings.ConfigError as exc:
            raise WorkflowError(str(exc))
    return _PLANS[name]


def job_name(wildcards):
    """The scene or run a job is of: its `run` wildcard (training and after), else `scene`."""
    return wildcards.get("run") or wildcards.scene


_NAMED = {}


def planned(stage):
    """The input function of a stage's rule: its plan's inputs as Snakemake's named inputs
    (chord.plan.scene_plan.named; the adapter reads them back with chord.plan.scene_plan.record). Made once per
    scene and stage (a plan is frozen; gaussians and voxelize ask once per object, the two
    training stages once each); Snakemake does not change what an input function returns.
    """

    def inputs(wildcards):
        name = job_name(wildcards)  # the inputs depend on the scene or run alone
        key = (stage, name)
        if key not in _NAMED:
            try:
                named = chord.plan.scene_plan.named(
                    getattr(plan(name), f"{stage}_inputs")()
                )
            except settings.ConfigError as exc:
                raise WorkflowError(str(exc))
            _NAMED[key] = named
        return _NAMED[key]

    return inputs


def demo_frame_num(name):
    """The frame count of a demo scene's motion.json: that of the sheet rows using it."""
    counts = {CONF.scenes[s].method.frame_num for s in SCENES if plan(s).demo == name}
    if len(counts) > 1:
        raise WorkflowError(
            f"scenes using demo {name} ask for different frame_num: {counts}"
        )
    return counts.pop() if counts else demo.DEFAULT_FRAME_NUM


# The rules' params are JOBS's (chord.plan.workflow_jobs), so the unit tests ask what the rules
# do: a sheet column a stage reads must change its params or its inputs.
def stage_params(name, stage):
    """The fields of a stage's config (chord.config.result_keys): the method keys it reads, of a
    scene or a run."""
    return JOBS.stage_params(name, stage)


def condition_params(scene):
    """What changes a scene's text embeddings: the prompts and the encoder's keys."""
    return JOBS.condition_params(scene)


def code_sources(wildcards):
    """The chord files a stage's result depends on: its module's imports, transitively."""
    if not _CODE:  # kept in .snakemake/ under the package tree's digest
        cache = os.path.join(".snakemake", "chord", "code_sources.json")
        _CODE.update(chord.plan.code_sources.cached_sources_by_stage(cache))
    return [str(p) for p in _CODE[wildcards.stage]]


def code_sha(wildcards):
    """The sha256 of those files' names and contents (a param: content changed under an
    older mtime, as from a restored copy, re-runs the stage too)."""
    return chord.plan.code_sources.digest(code_sources(wildcards))


def code(stage):
    """A stage's code input: its digest file."""
    return str(results_layout.code_digest(CODE_ROOT, stage))


def fitted_ply(wildcards):
    """The object's fitted 3DGS in the sheet's gaussians folder, if any."""
    return JOBS.fitted_ply(wildcards.scene, wildcards.obj)


# The experts' shapes for the memory model: the Wan folder's configs, else A14B.
MODEL = chord.resources.peak_memory.model_for(CONF.guidance.ckpt_dir)
# Host RAM of the condition job: the text encoder in float32 (UMT5-XXL ~23 GB).
CONDITION_MEM_MB = chord.resources.job_memory.condition_mem_mb(
    CONF.guidance.ckpt_dir, CONF.guidance.backend
)
# Each scene's start tier, each attempt's tier and job request, the training hashes: worked
# out once per workflow start (chord.plan.workflow_jobs). The GPUs of `auto` tiers: the config's
# gpu_mem_gb (a card label the profile sets) and gpus_per_node, else this machine's.
JOBS = chord.plan.workflow_jobs.WorkflowJobs(
    CONF,
    TIERS,
    scene_plan=plan,
    node=lambda: chord.resources.gpus.node(
        os.environ,
        gpu_mem_gb=config["gpu_mem_gb"],
        gpus_per_node=config["gpus_per_node"],
    ),
    model=MODEL,
    results=RESULTS,
    log=logger.info,
)


def asked(question, *args):
    """A question to JOBS, its input errors (naming the scene) as Snakemake's."""
    try:
        return question(*args)
    except settings.ConfigError as exc:
        raise WorkflowError(str(exc))


def scene_tier(scene):
    return asked(JOBS.scene_tier, scene)


def train_params(run):
    return asked(JOBS.training_hash, run)


def train_inputs(wildcards):
    """The plan's training inputs; a job request over its tier's host RAM stops the DAG build
    first."""
    asked(JOBS.check_job_requests, results_layout.run_parts(wildcards.run)[0])
    return planned("train")(wildcards)


def tier_resource(stage, key):
    """A training resource as a function of the attempt (chord.plan.workflow_jobs): tier, gpus
    (the rules' gpu resource), mem_mb, cpus_per_gpu, runtime, gpu_model or slurm_partition.
    A training job is a run's; the teacher preview is a scene's (its unswept run)."""
    return lambda wc, attempt: asked(
        JOBS.resource, wc.get("run", wc.get("scene")), stage, key, attempt
    )


def preview_mem_mb(wildcards, attempt):
    return asked(JOBS.preview_mem_mb, wildcards.scene, attempt)


def attempt_number(wildcards, attempt):
    """The attempt of a training job (a resource): a retry after a bad input stops at once."""
    return attempt


def condition_gpus(scene):
    return JOBS.condition_gpus(scene)


def condition_gpu_kind(key):
    def resource(wildcards):
        return asked(JOBS.condition_gpu_kind, wildcards.scene, key)

    return resource


# Declared only where some condition job takes a GPU: a rule's slurm_partition replaces the
# profile's default (the CPU partition) even where it is None (unset).
CONDITION_GPU_KIND = (
    {key: condition_gpu_kind(key) for key in ("gpu_model", "slurm_partition")}
    if any(condition_gpus(scene) for scene in SCENES)
    else {}
)


def aggregate_inputs(wildcards):
    """Every run's metrics.json and loss logs."""
    return chord.plan.scene_plan.named(
        chord.plan.scene_plan.aggregate_inputs({s: plan(s) for s in SCENES})
    )


def runs():
    """Every run's name (a scene, or a swept scene's <scene>/seed_<s>), in sheet order."""
    return [p.run for p in chord.plan.scene_plan.runs({s: plan(s) for s in SCENES})]


def sweep_rule():
    """What changes a sweep's choice: the rule (the seeds are its inputs)."""
    return {k: v for k, v in vars(CONF.sweep).items() if k != "seeds"}


def sweep_inputs(wildcards):
    """A swept scene's seeds' reference-camera videos and metrics."""
    return chord.plan.scene_plan.named(plan(wildcards.scene).sweep_inputs())


def preview_params(scene):
    """What changes a preview: its settings, the training hash and the keys of its view."""
    return asked(JOBS.preview_params, scene)


def debug_inputs(wildcards):
    """`snakemake debug --config debug_scene=<id>`: that scene's targets under debug.results."""
    if not DEBUG_SCENE:
        raise WorkflowError("the debug target needs a scene: --config debug_scene=<id>")
    return all_targets()


def all_targets():
    """The scene plans' targets and each run's preview strip (here, not in the plan, whose
    module every training's code digest includes)."""
    runs = [r.run for s in SCENES for r in plan(s).runs()]
    return chord.plan.scene_plan.all_targets({s: plan(s) for s in SCENES}, RESULTS) + [
        str(results_layout.preview_strip_png(RESULTS, r)) for r in runs
    ]


def training_previews(wildcards):
    """A run's live previews (train/previews/it_*.mp4), listed once its final training (a
    checkpoint) has finished: declared inputs of rule preview_strip, so nothing it reads is
    undeclared and a finished training is not run again for it."""
    stage = plan(wildcards.run).final_stage
    getattr(checkpoints, f"train_{stage}").get(run=wildcards.run)
    return sorted(
        str(p)
        for p in results_layout.previews_dir(RESULTS, wildcards.run).glob("it_*.mp4")
    )

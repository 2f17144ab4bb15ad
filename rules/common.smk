# Validation first, then the scene sheet, wildcard constraints, input functions and targets.
import os
from pathlib import Path

import pandas as pd
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

import chord
import chord.config as cc
import chord.demo as demo
import chord.gpus
import chord.out_of_memory
import chord.peak_memory
import chord.job_memory
import chord.job_size
import chord.paths as P
import chord.plan
import chord.result_keys as rk
import chord.sheet
import chord.sources
import chord.tiers as ct

validate(config, cc.CONFIG_SCHEMA)
DEBUG_SCENE = config["debug_scene"]
if DEBUG_SCENE:  # a debug run: one scene, the debug method values, its own results root
    if config["debug"]["results"] == config["results"]:
        raise WorkflowError("config: debug.results must differ from results")
    config["results"] = config["debug"]["results"]
    _over = config["scene_overrides"].get(DEBUG_SCENE, {})
    config["scene_overrides"][DEBUG_SCENE] = {**_over, **config["debug"]["method"]}
try:
    _rows = chord.sheet.read_sheet(config["scenes"])
    if DEBUG_SCENE and DEBUG_SCENE not in [r["scene"] for r in _rows]:
        raise cc.ConfigError(
            f"debug_scene: {DEBUG_SCENE!r} is not a scene of {config['scenes']}"
        )
    # the package's checks name the sheet's file and line; Snakemake's then see a valid sheet
    CONF = cc.load(config)
    validate(
        pd.DataFrame([{k: v for k, v in r.items() if k != "_line"} for r in _rows]),
        cc.SCENES_SCHEMA,
    )
    TIERS = ct.parse(CONF.tiers)
except cc.ConfigError as exc:
    raise WorkflowError(str(exc))

RESULTS = config["results"]
DEMO_DIR = config["demo_dir"]
SCENES = [DEBUG_SCENE] if DEBUG_SCENE else list(CONF.scenes)
# A stage's code input is one file, the sha256 of the chord sources its result depends on
# (written by rules/code.smk). It lives beside the demo scenes, outside any results root, so
# production and debug runs share it: one code change is a change for both.
CODE_ROOT = "resources"
_CODE = {}  # stage -> its sources, found once per run (chord.sources.sources_by_stage)


# The sheet's id pattern, not the list of ids: a 1000-name alternation in every output pattern
# makes the DAG build several times slower (bench/dag.py).
wildcard_constraints:
    scene=r"[A-Za-z0-9_-]+",
    run=P.RUN_PATTERN,  # a scene's training and what follows it: <scene> or <scene>/seed_<s>
    obj=r"obj_\d+",


_PLANS = {}


def plan(name):
    """The plan of a scene or of one run of it (chord.plan.scene): its files, objects by role,
    training stages and each stage's inputs and outputs, made once per workflow start.
    """
    if name not in _PLANS:
        scene, seed = P.run_parts(name)
        try:
            if seed is None:
                _PLANS[name] = chord.plan.scene(CONF, scene)
            else:
                _PLANS[name] = plan(scene).for_run(name)
        except cc.ConfigError as exc:
            raise WorkflowError(str(exc))
    return _PLANS[name]


def job_name(wildcards):
    """The scene or run a job is of: its `run` wildcard (training and after), else `scene`."""
    return wildcards.get("run") or wildcards.scene


_NAMED = {}


def planned(stage):
    """The input function of a stage's rule: its plan's inputs as Snakemake's named inputs
    (chord.plan.named; the adapter reads them back with chord.plan.record). Made once per
    scene and stage (a plan is frozen; gaussians and voxelize ask once per object, the two
    training stages once each); Snakemake does not change what an input function returns.
    """

    def inputs(wildcards):
        name = job_name(wildcards)  # the inputs depend on the scene or run alone
        key = (stage, name)
        if key not in _NAMED:
            try:
                named = chord.plan.named(getattr(plan(name), f"{stage}_inputs")())
            except cc.ConfigError as exc:
                raise WorkflowError(str(exc))
            _NAMED[key] = named
        return _NAMED[key]

    return inputs


def object_roles(scene):
    return plan(scene).roles


def demo_frame_num(name):
    """The frame count of a demo scene's motion.json: that of the sheet rows using it."""
    counts = {CONF.scenes[s].method.frame_num for s in SCENES if plan(s).demo == name}
    if len(counts) > 1:
        raise WorkflowError(
            f"scenes using demo {name} ask for different frame_num: {counts}"
        )
    return counts.pop() if counts else demo.DEFAULT_FRAME_NUM


def stage_params(name, stage):
    """The fields of a stage's config (chord.result_keys): the method keys it reads, of a
    scene or a run."""
    return rk.stage_params(run_spec(name).method, stage)


def run_spec(name):
    """The scene spec of a scene or run: a sweep's run has its own seed (chord.plan.run_spec)."""
    return chord.plan.run_spec(CONF, name)


def condition_params(scene):
    """What changes a scene's text embeddings: the prompts (the sheet's negative prompt, else
    the method's) and the condition stage's method and guidance keys (the encoder)."""
    spec = CONF.scenes[scene]
    return {
        "prompt": spec.prompt,
        **stage_params(scene, "condition"),
        "n_prompt": spec.n_prompt,
        "guidance": rk.guidance_params(CONF.guidance, "condition"),
    }


def code_sources(wildcards):
    """The chord files a stage's result depends on: its module's imports, transitively."""
    if not _CODE:
        _CODE.update(chord.sources.sources_by_stage())
    return [str(p) for p in _CODE[wildcards.stage]]


def code_sha(wildcards):
    """The sha256 of those files' names and contents (a param: content changed under an
    older mtime, as from a restored copy, re-runs the stage too)."""
    return chord.sources.digest(code_sources(wildcards))


def code(stage):
    """A stage's code input: its digest file."""
    return str(P.code_digest(CODE_ROOT, stage))


def fitted_ply(wildcards):
    folder = CONF.scenes[wildcards.scene].gaussians
    if folder is None:
        return []
    import chord.ply  # here: it imports trimesh (chord.gaussians), ~2 s the DAG build spares

    try:
        return [str(chord.ply.find_fitted_ply(Path(folder) / wildcards.obj))]
    except ValueError:
        return []  # the stage reports what is missing


def train_inputs(wildcards):
    """The plan's training inputs; a job request over its tier's host RAM stops the DAG build
    first."""
    check_job_requests(P.run_parts(wildcards.run)[0])
    return planned("train")(wildcards)


_TRAINING_JOB = {}


def training_job(name, tier):
    """A scene's or run's training on tier (chord.tiers.training_job: the tier's size and
    flags), made once per scene or run and tier (the training params and each tier's job
    request ask)."""
    if (name, tier.name) not in _TRAINING_JOB:
        job = ct.training_job(run_spec(name).method, CONF.memory, tier, scene=name)
        _TRAINING_JOB[name, tier.name] = job
    return _TRAINING_JOB[name, tier.name]


_TRAIN_PARAMS = {}


def train_params(name):
    """The result-changing method values and guidance (memory flags are not params; the size
    of a lowres start tier is) of a scene's or run's training. Hashed once per run: both
    training rules (and the preview) ask."""
    if name not in _TRAIN_PARAMS:
        scene = P.run_parts(name)[0]
        job = training_job(name, TIERS[scene_tier(scene)])
        _TRAIN_PARAMS[name] = job.config_hash(CONF.guidance)
    return _TRAIN_PARAMS[name]


_NODE = {}


def gpu_node():
    """The GPUs training jobs get, for `auto` tiers: the config's gpu_mem_gb (a card label,
    set by the profile) and gpus_per_node, else this machine's GPUs (nvidia-smi); None
    without any (a CPU run)."""
    if "node" not in _NODE:
        _NODE["node"] = chord.gpus.node(
            os.environ,
            gpu_mem_gb=config["gpu_mem_gb"],
            gpus_per_node=config["gpus_per_node"],
        )
    return _NODE["node"]


# The experts' shapes for the memory model: the Wan folder's configs, else A14B.
MODEL = chord.peak_memory.model_for(CONF.guidance.ckpt_dir)
# Host RAM of the condition job: the text encoder in float32 (UMT5-XXL ~23 GB).
CONDITION_MEM_MB = chord.job_memory.condition_mem_mb(
    CONF.guidance.ckpt_dir, CONF.guidance.backend
)


def condition_gpus(scene):
    """The condition job's gpu resource (chord.job_size.condition_gpus): 1 where the Wan
    folder's UMT5 encodes on a GPU (method.t5_cpu false), else 0."""
    return chord.job_size.condition_gpus(CONF.guidance, CONF.scenes[scene].method)


def condition_gpu_kind(key):
    """gpu_model or slurm_partition of a condition job that takes a GPU: its scene's start
    tier's (the kind the scene trains on); unset for one that does not."""

    def resource(wildcards):
        if condition_gpus(wildcards.scene):
            return getattr(TIERS[scene_tier(wildcards.scene)], key)
        return None

    return resource


# Declared only where some condition job takes a GPU: a rule's slurm_partition replaces the
# profile's default (the CPU partition) even where it is None (unset).
CONDITION_GPU_KIND = (
    {key: condition_gpu_kind(key) for key in ("gpu_model", "slurm_partition")}
    if any(condition_gpus(scene) for scene in SCENES)
    else {}
)
_SCENE_TIER = {}
_TIER_LINES = set()  # each distinct choice is logged once, not once per scene


def scene_tier(scene):
    """The tier a scene's training starts on: its sheet column, or auto (the first tier the
    node's GPUs match and that the peak-memory model predicts to fit; why each fuller tier was
    skipped is logged). Cached: the DAG asks many times per scene."""
    if scene not in _SCENE_TIER:
        auto = CONF.scenes[scene].tier == ct.AUTO
        node = gpu_node() if auto else None
        try:
            choice = chord.job_size.scene_start(CONF, plan(scene), TIERS, node, MODEL)
        except cc.ConfigError as exc:
            raise WorkflowError(str(exc))
        line = choice.describe()
        if auto and line not in _TIER_LINES:
            _TIER_LINES.add(line)
            logger.info(f"tier auto: scene {scene} (and others alike): {line}")
        _SCENE_TIER[scene] = choice.tier
    return _SCENE_TIER[scene]


def train_tier(run, stage, attempt):
    """The tier of a training attempt of a run: its scene's start tier, moved past tiers that
    ran out of memory (the run's record)."""
    oom = []
    if attempt > 1:
        record = P.checkpoints(RESULTS, run, stage) / chord.out_of_memory.RECORD
        oom = chord.out_of_memory.read(record)
    scene = P.run_parts(run)[0]
    return TIERS[ct.for_attempt(scene_tier(scene), attempt, TIERS, oom)]


_JOB_REQUEST = {}


def request_method(scene, tier):
    """The method a job request of scene on tier is sized for: the tier's (training_job);
    None for the oracle teacher, whose request does not depend on it (chord.job_size.job_request)
    and whose batch split over the tier's GPUs scene_tier has checked on every tier from the
    start tier (chord.tiers.start): one tier application per scene, not one per tier."""
    if CONF.guidance.backend == "oracle":
        return None
    return training_job(scene, tier).method


def job_request(scene, tier):
    """mem_mb and cpus_per_gpu of a training job of scene on tier: what it needs, the tier's
    values the ceiling (chord.job_size.job_request); a need over the tier's host_mem_gb stops the
    run, naming the scene. Cached: every attempt asks for each resource."""
    if (scene, tier.name) not in _JOB_REQUEST:
        spec = CONF.scenes[scene]
        try:
            _JOB_REQUEST[scene, tier.name] = chord.job_size.job_request(
                tier,
                backend=CONF.guidance.backend,
                method=request_method(scene, tier),
                mem=CONF.memory,
                roles=object_roles(scene),
                fitted=spec.gaussians,
                model=MODEL,
            )
        except cc.ConfigError as exc:
            start = scene_tier(scene)
            retry = (
                f" (a retry from tier {start} may reach it)"
                if start != tier.name
                else ""
            )
            raise WorkflowError(f"scene {scene}: {exc}{retry}")
    return _JOB_REQUEST[scene, tier.name]


def check_job_requests(scene):
    """The job request of every tier a scene's training may run on (its start tier and each
    one an out-of-memory retry may reach), at DAG build (train_inputs calls it): Snakemake
    evaluates resources only when a job is to run, after the scene's other stages."""
    names = list(TIERS)
    for name in names[names.index(scene_tier(scene)) :]:
        job_request(scene, TIERS[name])


def preview_mem_mb(wildcards, attempt):
    """Host RAM of a teacher preview on the tier of the scene's training: the oracle's little,
    else the memory model's (one Wan expert at a time, mmgp's staging on an enable_mmgp tier)
    with a 10% margin, the tier's host_mem_gb the ceiling."""
    if CONF.guidance.backend == "oracle":
        return chord.job_size.ORACLE_HOST_MB
    tier = train_tier(wildcards.scene, "coarse", attempt)
    mem = training_job(wildcards.scene, tier).memory
    return chord.job_memory.preview_mem_mb(mem, ceiling_mb=tier.mem_mb, model=MODEL)


def attempt_number(wildcards, attempt):
    """The attempt of a training job (a resource): a retry after a bad input stops at once."""
    return attempt


def tier_resource(stage, key):
    """A training resource as a function of the attempt: tier, gpus (the tier's GPU count:
    the rules' gpu resource), mem_mb, cpus_per_gpu, runtime, gpu_model or slurm_partition
    (None, i.e. unset, where the tier has none)."""
    attr = {"tier": "name", "runtime": "runtime_min"}.get(key, key)

    def resource(wildcards, attempt):
        # A training job is a run's; the teacher preview is a scene's (its unswept run).
        run = wildcards.get("run", wildcards.get("scene"))
        tier = train_tier(run, stage, attempt)
        if key in ("mem_mb", "cpus_per_gpu"):
            return job_request(P.run_parts(run)[0], tier)[key]
        return getattr(tier, attr)

    return resource


def aggregate_inputs(wildcards):
    """Every run's metrics.json and loss logs."""
    return chord.plan.named(chord.plan.aggregate_inputs({s: plan(s) for s in SCENES}))


def runs():
    """Every run's name (a scene, or a swept scene's <scene>/seed_<s>), in sheet order."""
    return [p.run for p in chord.plan.runs({s: plan(s) for s in SCENES})]


def sweep_rule():
    """What changes a sweep's choice: the rule (the seeds are its inputs)."""
    return {k: v for k, v in vars(CONF.sweep).items() if k != "seeds"}


def sweep_inputs(wildcards):
    """A swept scene's seeds' reference-camera videos and metrics."""
    return chord.plan.named(plan(wildcards.scene).sweep_inputs())


def preview_params(scene):
    """What changes a preview: its sampling settings, the training hash (the scene's
    result-changing method and teacher) and the other keys it reads (its view)."""
    view = {
        k: v
        for k, v in stage_params(scene, "preview").items()
        if k not in rk.STAGE_KEYS["train"]
    }
    return {"preview": vars(CONF.preview), "method": train_params(scene), "view": view}


def debug_inputs(wildcards):
    """`snakemake debug --config debug_scene=<id>`: that scene's targets under debug.results."""
    if not DEBUG_SCENE:
        raise WorkflowError("the debug target needs a scene: --config debug_scene=<id>")
    return all_targets()


def all_targets():
    return chord.plan.all_targets({s: plan(s) for s in SCENES}, RESULTS)

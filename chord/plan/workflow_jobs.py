"""The jobs of one workflow start, as the rules' params and resources ask for them: each
stage's params (what changes its result besides its code and input files), each scene's start
tier, the tier of each attempt, the training hash and the job request (host RAM, CPUs) on each
tier, each worked out once and kept.

Torch-free (the DAG build imports it). Errors are :class:`chord.config.settings.ConfigError` naming
the
scene; ``rules/common.smk`` turns them into Snakemake's WorkflowError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from chord.config import result_keys as rk
from chord.config import settings
from chord.core.errors import InputError
from chord.plan import results_layout
from chord.plan import scene_plan as cp
from chord.resources import job_memory, job_size, out_of_memory, tiers


class WorkflowJobs:
    """The jobs of ``conf``'s scenes on the tier table ``table``.

    ``scene_plan(name)`` gives a scene's plan (the workflow's cache), ``node()`` the GPUs
    training jobs get (asked once, and only for an ``auto`` tier), ``model`` the experts'
    shapes of the memory model, ``results`` the results root (where out-of-memory records
    are) and ``log`` where each distinct ``auto`` choice is said once.
    """

    def __init__(
        self,
        conf: settings.Config,
        table: Mapping[str, tiers.Tier],
        *,
        scene_plan: Callable[[str], cp.ScenePlan],
        node: Callable[[], object],
        model,
        results: str | Path,
        log: Callable[[str], None],
    ):
        self.conf, self.tiers, self.model, self.results = conf, table, model, results
        self._plan, self._find_node, self._log = scene_plan, node, log
        self._node: list = []  # the node, once asked
        self._start: dict[str, str] = {}
        self._said: set[str] = set()
        self._job: dict[tuple[str, str], tiers.TrainingJob] = {}
        self._hash: dict[str, object] = {}
        self._request: dict[tuple[str, str], dict] = {}

    def node(self):
        """The GPUs training jobs get (``node()`` of the constructor), asked once."""
        if not self._node:
            self._node.append(self._find_node())
        return self._node[0]

    def scene_tier(self, scene: str) -> str:
        """The tier a scene's training starts on: its sheet column, or auto (the first tier the
        node's GPUs match and the peak-memory model predicts to fit; why each fuller tier was
        skipped is logged, each distinct line once)."""
        if scene not in self._start:
            auto = self.conf.scenes[scene].tier == tiers.AUTO
            node = self.node() if auto else None
            choice = job_size.scene_start(
                self.conf, self._plan(scene), self.tiers, node, self.model
            )
            line = choice.describe()
            if auto and line not in self._said:
                self._said.add(line)
                self._log(f"tier auto: scene {scene} (and others alike): {line}")
            self._start[scene] = choice.tier
        return self._start[scene]

    def attempt_tier(self, run: str, stage: str, attempt: int) -> tiers.Tier:
        """The tier of a training attempt of a run (or of a scene's preview): its scene's start
        tier, moved past the tiers its out-of-memory record names."""
        oom = []
        if attempt > 1:
            record = results_layout.checkpoints(self.results, run, stage) / out_of_memory.RECORD
            try:
                oom = out_of_memory.read(record)
            except InputError as exc:  # this run retries on its tier; the others as they are
                self._log(f"warning: {exc}")
        start = self.scene_tier(results_layout.run_parts(run)[0])
        return self.tiers[tiers.for_attempt(start, attempt, self.tiers, oom)]

    def training_job(self, run: str, tier: tiers.Tier) -> tiers.TrainingJob:
        """A scene's or run's training on tier (the tier's size and flags applied once)."""
        if (run, tier.name) not in self._job:
            method = cp.run_spec(self.conf, run).method
            self._job[run, tier.name] = tiers.training_job(
                method, self.conf.memory, tier, scene=run
            )
        return self._job[run, tier.name]

    def training_hash(self, run: str):
        """The training's result-changing method values and teacher on its start tier (the
        size of a lowres start tier counts; memory flags do not): the training rules' and the
        preview's param."""
        if run not in self._hash:
            tier = self.tiers[self.scene_tier(results_layout.run_parts(run)[0])]
            self._hash[run] = self.training_job(run, tier).config_hash(self.conf.guidance)
        return self._hash[run]

    # -- the rules' params: what each stage reads of the sheet and the config -------------

    def stage_params(self, name: str, stage: str) -> dict:
        """The method keys ``stage`` reads (:mod:`chord.config.result_keys`), of a scene or a
        run: the params of rules ingest, gaussians, voxelize, reference, export, evaluate."""
        return rk.stage_params(cp.run_spec(self.conf, name).method, stage)

    def condition_params(self, scene: str) -> dict:
        """What changes a scene's text embeddings: the prompts (the sheet's negative prompt,
        else the method's) and the condition stage's method and guidance keys (the encoder)."""
        spec = self.conf.scenes[scene]
        return {
            "prompt": spec.prompt,
            **self.stage_params(scene, "condition"),
            "n_prompt": spec.n_prompt,
            "guidance": rk.guidance_params(self.conf.guidance, "condition"),
        }

    def preview_params(self, scene: str) -> dict:
        """What changes a teacher preview: its sampling settings, the training hash (the
        scene's result-changing method and teacher) and the other keys it reads (its view)."""
        view = {
            k: v
            for k, v in self.stage_params(scene, "preview").items()
            if k not in rk.STAGE_KEYS["train"]
        }
        return {
            "preview": vars(self.conf.preview),
            "method": self.training_hash(scene),
            "view": view,
        }

    def fitted_ply(self, scene: str, obj: str) -> list[str]:
        """The fitted 3DGS of ``obj`` in the scene's sheet ``gaussians`` folder (the gaussians
        rule's input): [] without a folder, or when it has none (the stage says what is
        missing)."""
        folder = self.conf.scenes[scene].gaussians
        if folder is None:
            return []
        from chord.gaussians import ply  # here: it imports trimesh, ~2 s the DAG build spares

        try:
            return [str(ply.find_fitted_ply(Path(folder) / obj))]
        except ValueError:
            return []

    def job_request(self, scene: str, tier: tiers.Tier) -> dict:
        """mem_mb and cpus_per_gpu of a training job of scene on tier (job_size.job_request: what
        it needs, the tier's values the ceiling); a need over the tier's host_mem_gb is an
        error naming the scene."""
        if (scene, tier.name) not in self._request:
            spec = self.conf.scenes[scene]
            # the oracle's request does not depend on the method: no tier application per tier
            method = None
            if self.conf.guidance.backend != "oracle":
                method = self.training_job(scene, tier).method
            try:
                self._request[scene, tier.name] = job_size.job_request(
                    tier,
                    backend=self.conf.guidance.backend,
                    method=method,
                    mem=self.conf.memory,
                    roles=self._plan(scene).roles,
                    fitted=spec.gaussians,
                    model=self.model,
                )
            except settings.ConfigError as exc:
                start = self.scene_tier(scene)
                retry = f" (a retry from tier {start} may reach it)" if start != tier.name else ""
                raise settings.ConfigError(f"scene {scene}: {exc}{retry}") from None
        return self._request[scene, tier.name]

    def check_job_requests(self, scene: str) -> None:
        """The job request of every tier a scene's training may run on (its start tier and each
        one a retry may reach), at DAG build: Snakemake evaluates resources only when a job is
        to run, after the scene's other stages."""
        names = list(self.tiers)
        for name in names[names.index(self.scene_tier(scene)) :]:
            self.job_request(scene, self.tiers[name])

    def resource(self, run: str, stage: str, key: str, attempt: int):
        """A training (or preview) job's resource on its attempt's tier: tier, gpus, mem_mb,
        cpus_per_gpu, runtime, gpu_model or slurm_partition (None: unset)."""
        tier = self.attempt_tier(run, stage, attempt)
        if key in ("mem_mb", "cpus_per_gpu"):
            return self.job_request(results_layout.run_parts(run)[0], tier)[key]
        return getattr(tier, {"tier": "name", "runtime": "runtime_min"}.get(key, key))

    def preview_mem_mb(self, scene: str, attempt: int) -> int:
        """Host RAM of a teacher preview on its attempt's tier: the oracle's little, else the
        memory model's (one Wan expert at a time) with a margin, host_mem_gb the ceiling."""
        if self.conf.guidance.backend == "oracle":
            return job_size.ORACLE_HOST_MB
        tier = self.attempt_tier(scene, "coarse", attempt)
        mem = self.training_job(scene, tier).memory
        return job_memory.preview_mem_mb(mem, ceiling_mb=tier.mem_mb, model=self.model)

    def condition_gpus(self, scene: str) -> int:
        """The condition job's gpu resource: 1 where the Wan folder's UMT5 encodes on a GPU."""
        return job_size.condition_gpus(self.conf.guidance, self.conf.scenes[scene].method)

    def condition_gpu_kind(self, scene: str, key: str):
        """gpu_model or slurm_partition of a condition job: its scene's start tier's where it
        takes a GPU, else None (unset)."""
        if self.condition_gpus(scene):
            return getattr(self.tiers[self.scene_tier(scene)], key)
        return None

"""``chord doctor``: the preflight's checks (:mod:`chord.checks.preflight`; the rows from
:mod:`chord.checks.gpu`, :mod:`chord.checks.teacher` and :mod:`chord.checks.capacity`) for every
scene of a workflow config on this machine, run on the GPU node before a long run: the renderer,
the Wan folder, the Tiny VAE, each scene's tier and its predicted peak against the GPU and host
RAM, and the disk for every scene's outputs."""

from __future__ import annotations

from collections.abc import Mapping

from chord.checks.capacity import (
    GiB,
    check_allocator,
    check_disk,
    check_memory,
    checkpoint_bytes,
    control_points,
    export_bytes,
)
from chord.checks.gpu import check_cuda, check_renderer
from chord.checks.report import FAIL, NA, PASS, Check
from chord.checks.teacher import check_tiny_vae, check_wan_folder
from chord.config import settings
from chord.plan import scene_plan as plan
from chord.resources import gpus, job_size, peak_memory, tiers
from chord.resources.machine import host_bytes, torch_node


def _reference(conf: settings.Config):
    """The first scene's reference render (ref.png) that exists, for the Tiny VAE's latent-scale
    check; None before any has been rendered."""
    from chord.plan import results_layout

    for name in conf.scenes:
        png = results_layout.reference_png(conf.results, name)
        if png.is_file():
            return png
    return None


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run(conf: settings.Config, env: Mapping[str, str]) -> list:
    """Every check for the workflow configuration ``conf`` on this machine. The tiers are
    chosen as the workflow's DAG build chooses them: for the config's ``gpu_mem_gb`` and
    ``gpus_per_node``, else for the GPUs ``nvidia-smi`` lists
    (:func:`chord.resources.gpus.node`)."""
    guidance = conf.guidance
    methods = [s.method for s in conf.scenes.values()]
    wan = guidance.backend == "wan"
    model = peak_memory.model_for(guidance.ckpt_dir)
    checks = [
        Check(
            "config",
            PASS,
            f"{len(conf.scenes)} scene(s), guidance {guidance.backend}, render_backend "
            f"{conf.render_backend}, tiers {', '.join(conf.tiers)}",
        ),
        # an A14B-sized teacher needs a GPU; a small test model runs on a CPU
        check_cuda(needs_gpu=wan and model.dit == peak_memory.A14B.dit),
        check_renderer(conf.render_backend, parity=True),
        check_wan_folder(guidance),
        check_tiny_vae(guidance, methods, reference=_reference(conf), device=_device()),
    ]
    node = gpus.node(env, gpu_mem_gb=conf.gpu_mem_gb, gpus_per_node=conf.gpus_per_node)
    node = node or torch_node()
    gpu = None if node is None else node.total_bytes
    # the job's node, not a login node: this machine's RAM only where the GPUs are its own
    host = host_bytes(env) if node is not None and node.source != "config" else None
    tier_table = tiers.parse(conf.tiers)
    groups: dict = {}  # (tier, estimate) -> scenes: one row per distinct training
    choices: dict = {}  # what auto said -> scenes
    disk_need = 0
    for name, spec in conf.scenes.items():
        try:
            scene_plan = plan.scene(conf, name)
        except settings.ConfigError as exc:
            checks.append(Check("scene", FAIL, str(exc)))
            continue
        roles, dynamic = scene_plan.roles, scene_plan.dynamic
        imported = job_size.imported_counts(spec.gaussians, scene_plan.kept)
        n, dyn = job_size.gaussian_counts(spec.method, roles, imported)
        disk_need += checkpoint_bytes(spec.method, control_points(spec.method, dynamic))
        disk_need += export_bytes(spec.method, n, bool(imported))
        if not wan or n <= 0:
            continue
        try:
            choice = job_size.scene_start(conf, scene_plan, tier_table, node, model)
        except settings.ConfigError as exc:
            checks.append(Check("tier", FAIL, str(exc), "see the message"))
            continue
        tier = choice.tier
        choices.setdefault(choice.describe(), []).append(name)
        contact = job_size.contact_points(spec.method, roles)  # its rows name it where on
        e = job_size.estimate(
            spec.method, conf.memory, tier_table[tier], n, dyn, model, contact_points=contact
        )
        key = (tier, e["reserved_bytes"], e["host_bytes"])
        groups.setdefault(key, (e, []))[1].append(name)
    if not wan:
        checks.append(
            Check("gpu memory", NA, f"the model describes the wan teacher, not {guidance.backend}")
        )
    for line, names in choices.items():
        more = f" (+{len(names) - 3})" if len(names) > 3 else ""
        checks.append(Check("tier", PASS, f"scene(s) {', '.join(names[:3])}{more}: {line}"))
    for (tier, _, _), (e, names) in groups.items():
        more = f" (+{len(names) - 3})" if len(names) > 3 else ""
        label = f"tier {tier}, scene(s) {', '.join(names[:3])}{more}"
        job = int(tier_table[tier].host_mem_gb * GiB)  # the job's mem_mb
        checks += check_memory(label, e, gpu, min(host or job, job), gpu_fatal=True)
    checks.append(check_allocator(env))
    checks.append(check_disk(conf.results, disk_need, f"{len(conf.scenes)} scene(s)' outputs"))
    return checks

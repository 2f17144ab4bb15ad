"""The workflow at scale (issue 8): out-of-memory escalation across memory tiers, the Slurm
profile's submissions per tier, re-run semantics and the debug target.

One tiny demo scene is run end to end once (the fixture ``finished`` in conftest.py, with an
injected out-of-memory on its first attempt); the re-run tests are dry runs against that
finished state, with config changes passed as an extra --configfile, so they share it without
copying.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.components import require_slurm_plugin
from tests.conftest import REPO
from tests.workflow import snakemake_cli
from tests.workflow.test_workflow import planned_jobs

# Small enough for a CPU: few Gaussians, 2 iterations of one 64x32 video (without the shipped
# early stop, which would end it after ⌊2·2/3⌋ = 1).
TINY = {
    "gs_init_num": 500,
    "surface_target_num": 500,
    "iterations": 2,
    "early_stop": False,
    "batch_size": 1,
    "size": "64*32",
    "seed": 0,
}
PROMPT = "A toy block with a painted face hops twice to the right."
UPSTREAM = {"demo_hop", "ingest", "gaussians", "voxelize", "reference", "condition"}
# the stages that read a trained state (the viewer reads the export's GLB)
AFTER_TRAINING = {"export", "viewer", "evaluate", "aggregate", "preview_strip"}


def snakemake(work: Path, *args: str, env: dict | None = None, check: bool = True):
    """Snakemake in ``work`` on its copy of the workflow (work/wf: :func:`copy_workflow`; its
    default profile applies), through tests/workflow/snakemake_cli.py."""
    cmd = ["--snakefile", str(work / "wf/Snakefile"), "--cores", "2", *args]
    full_env = {k: v for k, v in os.environ.items() if k != "CHORD_TEST_OOM_TIERS"}
    full_env.update({"PYTHONPATH": str(work / "wf"), **(env or {})})
    proc = snakemake_cli.run(cmd, cwd=work, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}"
        )
    return proc


def copy_workflow(work: Path) -> None:
    """The workflow and the chord package, copied to work/wf: Snakemake imports chord from
    beside the Snakefile, so a test can edit a module of the copy without touching the
    repository."""
    skip = shutil.ignore_patterns("__pycache__", "node_modules")
    (work / "wf").mkdir(parents=True)
    shutil.copy2(REPO / "Snakefile", work / "wf/Snakefile")
    for folder in ("rules", "workflow", "chord", "profiles"):
        shutil.copytree(REPO / folder, work / "wf" / folder, ignore=skip)


def write_sheet(path: Path, tier: str, prompt: str = PROMPT) -> None:
    path.write_text(f"scene\tdata\tprompt\ttier\nhop\tresources/demo/hop\t{prompt}\t{tier}\n")


def extra_config(work: Path, name: str, values: dict) -> str:
    """A config file merged over config/config.yaml (--configfile): a change without editing."""
    path = work / "config" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def tiny_workdir(work: Path) -> Path:
    """The default config with the demo scene hop (tier full), TINY, one extra lean tier with
    a smaller size, and a copy of the chord package (so a test can edit a module)."""
    copy_workflow(work)
    (work / "config").mkdir(parents=True)
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["scene_overrides"] = {"hop": dict(TINY)}
    leanest = dict(list(conf["tiers"].values())[-1])
    conf["tiers"]["lowres_tiny"] = {**leanest, "gpu_mem_gb": 8, "size": "32*16"}
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    write_sheet(work / "config/scenes.tsv", "full")
    return work


def rules_in_workflow(work: Path) -> set[str]:
    return set(snakemake(work, "--list-rules").stdout.split())


def after_training(work: Path) -> set[str]:
    return AFTER_TRAINING & rules_in_workflow(work)


def test_out_of_memory_on_attempt_1_retries_on_the_next_tier(finished):
    work, log = finished
    train = [line for line in log.splitlines() if "tier=" in line]
    assert len(train) == 2, log[-4000:]  # train_coarse's two attempts
    assert "tier=full" in train[0] and "tier=split" in train[1]
    # split's time; the oracle's host RAM and one CPU (the tier's 64 GB, 8 CPUs: the ceiling)
    assert "runtime=960" in train[1] and "mem_mb=2048" in train[1], train[1]
    assert "cpus_per_gpu=1" in train[1], train[1]
    assert "returned non-zero exit status 3" in log  # the out-of-memory exit
    state = torch.load(work / "results/hop/train/coarse.pt", weights_only=True)
    assert state["tier"] == "split" and state["size"] == "64*32" and state["iteration"] == 2
    assert not (work / "results/hop/checkpoints/coarse" / "out_of_memory.txt").exists()
    # the rule's log keeps both attempts (Snakemake deletes it before the retry)
    text = (work / "results/hop/logs/train_coarse.log").read_text()
    assert text.count("attempt started") == 2, text
    oom, split = text.index("out of GPU memory"), text.index("training coarse on tier split")
    assert text.index("attempt started") < oom < text.rindex("attempt started") < split, text
    assert not (work / "results/hop/checkpoints/coarse/train.log").exists()  # done: removed
    # the scene completed: every target is there and up to date
    assert planned_jobs(snakemake(work, "-n")) == {}


def test_out_of_memory_on_every_tier_fails_once_naming_the_tiers_and_the_remedies(
    finished, tmp_path
):
    """One attempt per tier, then the scene fails: no attempt repeats the leanest tier, and
    the log names the tiers tried and what lowers the peak. (The training of a copy of the
    finished run, forced: its stages before the training are up to date.)"""
    work = tmp_path / "w"
    shutil.copytree(finished[0], work, symlinks=True)  # with its files' times: up to date
    names = list(yaml.safe_load((work / "config/config.yaml").read_text())["tiers"])
    target = "results/hop/train/coarse.pt"
    oom = {"CHORD_TEST_OOM_TIERS": ",".join(names)}
    proc = snakemake(work, target, "--forcerun", "train_coarse", env=oom, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    attempts = [
        line.split("tier=")[1].split(",")[0] for line in out.splitlines() if "tier=" in line
    ]
    assert attempts == names, out[-3000:]
    text = (work / "results/hop/logs/train_coarse.log").read_text()
    assert text.count("attempt started") == len(names)
    assert f"out of GPU memory on every tier tried ({', '.join(names)})" in text, text
    assert "To lower the peak: method.use_tiny_vae: true" in text


def test_memory_flag_or_tier_change_reruns_nothing(finished):
    work, _ = finished
    flags = {"split_sds_backward": True, "split_render_backward": True, "enable_mmgp": True}
    extra = extra_config(work, "flags", {"memory": flags})
    assert planned_jobs(snakemake(work, "-n", "--configfile", extra)) == {}
    write_sheet(work / "config/split.tsv", "offload")
    extra = extra_config(work, "tier", {"scenes": "config/split.tsv"})
    assert planned_jobs(snakemake(work, "-n", "--configfile", extra)) == {}


def test_tier_with_a_lower_size_reruns_training_onward(finished):
    work, _ = finished
    write_sheet(work / "config/tiny.tsv", "lowres_tiny")
    extra = extra_config(work, "tiny", {"scenes": "config/tiny.tsv"})
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", extra))
    assert set(jobs) == {"train_coarse"} | after_training(work)


@pytest.mark.parametrize(
    "change, first",
    [
        ({"lambda_arap": 1.0}, set()),
        ({"init_voxel_size": 0.02}, {"voxelize"}),
    ],
    ids=["lambda_arap", "init_voxel_size"],
)
def test_method_change_reruns_the_stages_that_read_it(finished, change, first):
    work, _ = finished
    extra = extra_config(work, "method", {"scene_overrides": {"hop": change}})
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", extra))
    assert set(jobs) == first | {"train_coarse"} | after_training(work)


def test_prompt_change_reruns_condition_onward(finished):
    work, _ = finished
    write_sheet(work / "config/prompt.tsv", "full", PROMPT.replace("twice", "three times"))
    extra = extra_config(work, "prompt", {"scenes": "config/prompt.tsv"})
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", extra))
    assert set(jobs) == {"condition", "train_coarse"} | after_training(work)


def test_debug_target_runs_one_scene_apart_from_production(finished):
    """The debug target plans the scene's whole chain under debug/ (the finished production
    results satisfy none of it); its training runs 20 iterations with a checkpoint every 5,
    and production stays untouched and complete."""
    work, _ = finished
    production = work / "results/hop/train/coarse.pt"
    before = production.stat().st_mtime_ns
    dry = snakemake(work, "debug", "--config", "debug_scene=hop", "-n")
    jobs = planned_jobs(dry)
    expected = UPSTREAM - {"demo_hop"} | {"train_coarse", "debug"} | after_training(work)
    assert set(jobs) == expected
    lines = [line.strip() for line in dry.stdout.splitlines()]
    outputs = [p.strip() for s in lines if s.startswith("output:") for p in s[7:].split(",")]
    assert outputs and all(p.startswith("debug/") for p in outputs), outputs
    # the training of the debug run, for real (the stages after it are covered by the dry run)
    snakemake(work, "debug/hop/train/coarse.pt", "--config", "debug_scene=hop")
    ckpts = sorted(p.name for p in (work / "debug/hop/checkpoints/coarse").glob("*/ckpt_*.pt"))
    assert ckpts == [f"ckpt_{i:06d}.pt" for i in (1, 5, 10, 13, 15, 20)]  # save_interval 5
    state = torch.load(work / "debug/hop/train/coarse.pt", weights_only=True)
    assert state["iteration"] == 20  # debug.method: iterations 20
    assert production.stat().st_mtime_ns == before
    assert planned_jobs(snakemake(work, "-n")) == {}  # production untouched and complete
    proc = snakemake(work, "debug", "-n", check=False)
    assert proc.returncode != 0 and "debug_scene=<id>" in proc.stdout + proc.stderr


def tier_of_training(proc) -> str:
    """The tier in a dry run's train_coarse job resources."""
    lines = [line for line in proc.stdout.splitlines() if "tier=" in line]
    assert len(lines) == 1, proc.stdout[-3000:]
    return lines[0].split("tier=")[1].split(",")[0]


def test_auto_tier_rejects_what_the_memory_model_says_will_not_fit(tmp_path):
    """Dry runs (seconds, no finished state) of the demo scene hop with tier auto, the Wan
    teacher and a 48 GB GPU (--config gpu_mem_gb=48), at the documented shapes (832*480, 41
    frames, batch 4, the Tiny VAE; two objects of 100k Gaussians): split, as declared. With
    1M Gaussians per object the model predicts split over 48 GB: offload. With the Wan VAE as
    encoder no tier is predicted to fit: split by its declared memory, and a warning saying
    so."""
    work = tmp_path / "w"
    copy_workflow(work)
    (work / "config").mkdir()
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    # the model is the Wan teacher's (the oracle skips it); the folder is not there: A14B
    conf["guidance"].update(
        backend="wan", ckpt_dir=str(work / "Wan2.2-I2V-A14B"), tiny_vae_path="lighttaew2_1.pth"
    )
    conf["scene_overrides"] = {"hop": {"use_tiny_vae": True}}
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    write_sheet(work / "config/scenes.tsv", "auto")
    target = ["-n", "results/hop/train/coarse.pt", "--config", "gpu_mem_gb=48"]
    assert tier_of_training(snakemake(work, *target)) == "split"
    dense = extra_config(work, "dense", {"scene_overrides": {"hop": {"gs_init_num": 1_000_000}}})
    assert tier_of_training(snakemake(work, *target, "--configfile", dense)) == "offload"
    wan_vae = extra_config(work, "wan_vae", {"scene_overrides": {"hop": {"use_tiny_vae": False}}})
    proc = snakemake(work, *target, "--configfile", wan_vae)
    assert tier_of_training(proc) == "split"
    assert proc.stderr.count("the memory model predicts that no tier fits 1 x a 48 GB GPU") == 1


FAKE_SBATCH = """#!/bin/sh
echo "$*" >> "{log}"
echo "sbatch: error: test stub, nothing submitted" >&2
exit 1
"""


def test_slurm_profile_submits_each_tier_with_its_gpu_memory_and_time(tmp_path):
    """With stub Slurm commands on PATH, the submitted sbatch lines carry each tier's GPU kind,
    partition, host memory and wall time (profiles/slurm and its site.yaml)."""
    require_slurm_plugin()
    work = tmp_path / "w"
    copy_workflow(work)
    (work / "config").mkdir()
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["scene_overrides"] = {}
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    scenes = {"sfull": "full", "ssplit": "split", "soff": "offload", "slow": "lowres"}
    rows = [f"{s}\tdata/toy\tp\t{t}" for s, t in scenes.items()]
    (work / "config/scenes.tsv").write_text("scene\tdata\tprompt\ttier\n" + "\n".join(rows) + "\n")
    data = work / "data/toy"
    data.mkdir(parents=True)
    for name in ("scene.glb", "obj_0.glb", "obj_1.glb", "motion.json"):
        (data / name).touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(log=log))
    for tool in ("sacct", "sacctmgr", "sshare", "sinfo", "squeue", "scontrol"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    # Everything before training exists (written after the inputs, so it is up to date).
    for scene in scenes:
        (work / "results" / scene / "scene/meshes").mkdir(parents=True)
        for rel in (
            "scene/scene.json",
            "condition/text.safetensors",
            "gaussians/obj_0.ply",
            "gaussians/obj_1.ply",
            "voxels/obj_0.npz",
        ):
            path = work / "results" / scene / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    targets = [f"results/{s}/train/coarse.pt" for s in scenes]
    profile = ["--workflow-profile", str(work / "wf/profiles/slurm")]
    quick = ["--slurm-init-seconds-before-status-checks", "1"]
    snakemake(work, *profile, *quick, *targets, env=env, check=False)
    calls = {}
    for line in log.read_text().splitlines():
        if "rule_train_coarse_wildcards_" not in line:
            continue  # the --wrap'ed command's own lines
        scene = line.split("rule_train_coarse_wildcards_")[1].split()[0]
        calls.setdefault(scene, line)  # the first attempt
    assert set(calls) == set(scenes)
    site = yaml.safe_load((REPO / "profiles/slurm/site.yaml").read_text())["tiers"]
    for scene, tier in scenes.items():
        spec = conf["tiers"][tier]
        args = calls[scene].split()
        assert f"--gpus={site[tier]['gpu_model']}:1" in args, calls[scene]
        assert args[args.index("-p") + 1] == site[tier]["slurm_partition"]
        # the oracle training's needs, below the tier's host_mem_gb and cpus_per_gpu
        assert int(args[args.index("--mem") + 1]) == 2048 < spec["host_mem_gb"] * 1024
        assert args[args.index("-t") + 1] == str(int(spec["runtime_h"] * 60))
        assert "--cpus-per-gpu=1" in args and "--requeue" in args  # resumes after preemption
        assert "--open-mode=append" in calls[scene]  # a requeued job keeps its Slurm log


def wan_workdir(work: Path, tiny_vae: bool = True) -> Path:
    """The shipped config (no demo overrides: 832*480, 41 frames, batch 4, the Tiny VAE) with
    the Wan teacher; its folder is not there, so the memory model takes A14B's shapes."""
    copy_workflow(work)
    (work / "config").mkdir()
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["guidance"].update(backend="wan", ckpt_dir=str(work / "Wan2.2-I2V-A14B-Diffusers"))
    if tiny_vae:
        from safetensors.torch import save_file

        from chord.guidance.tiny_vae import TinyVAEEncoder

        save_file(TinyVAEEncoder().state_dict(), str(work / "lighttaew2_1.safetensors"))
        conf["guidance"]["tiny_vae_path"] = str(work / "lighttaew2_1.safetensors")
    conf["scene_overrides"] = {}
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    write_sheet(work / "config/scenes.tsv", "auto")
    return work


def test_the_shipped_method_with_the_wan_teacher_plans_full_size_on_an_80_gb_gpu(tmp_path):
    """Dry runs: the shipped config on an 80 GB GPU trains hop at 832*480 on tier full. With
    the full Wan VAE as encoder only lowres_min fits, and auto does not lower the size by
    itself: the DAG build stops, naming the peak and the remedies; auto_lowres allows it. A
    missing tiny_vae_path is an error naming the key."""
    work = wan_workdir(tmp_path / "w")
    target = ["-n", "results/hop/train/coarse.pt", "--config", "gpu_mem_gb=80"]
    assert tier_of_training(snakemake(work, *target)) == "full"  # no size: the method's 832*480
    wan_vae = extra_config(work, "wan_vae", {"method": {"use_tiny_vae": False}})
    proc = snakemake(work, *target, "--configfile", wan_vae, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert (
        "no tier at the method's size fits 1 x a 80 GB GPU" in out
        and "lowres_min at size 416*240" in out
    )
    assert "use_tiny_vae: true" in out and "auto_lowres: true" in out
    allowed = extra_config(
        work, "allowed", {"method": {"use_tiny_vae": False}, "auto_lowres": True}
    )
    assert tier_of_training(snakemake(work, *target, "--configfile", allowed)) == "lowres_min"
    bare = wan_workdir(tmp_path / "bare", tiny_vae=False)
    proc = snakemake(bare, *target, check=False)
    assert proc.returncode != 0 and "guidance.tiny_vae_path: not set" in proc.stdout + proc.stderr


def test_wan_training_jobs_ask_for_the_models_host_ram_below_the_tiers_ceiling(tmp_path):
    """A Wan training holds one expert in host RAM (A14B: ~14B parameters in bf16, ~27 GiB)
    plus the process: its job asks for that with a 10% margin, not the tier's 64 GB; the
    offload tier adds mmgp's staging and stays below its 96 GB. CPUs: the tier's."""
    work = wan_workdir(tmp_path / "w")
    target = ["-n", "results/hop/train/coarse.pt", "--config", "gpu_mem_gb=80"]
    line = next(x for x in snakemake(work, *target).stdout.splitlines() if "tier=" in x)
    mem = int(line.split("mem_mb=")[1].split(",")[0])
    assert 30_000 < mem < 65_536 and "cpus_per_gpu=8" in line, line
    target[-1] = "gpu_mem_gb=24"
    line = next(x for x in snakemake(work, *target).stdout.splitlines() if "tier=" in x)
    assert "tier=offload" in line, line
    assert mem < int(line.split("mem_mb=")[1].split(",")[0]) < 96 * 1024, line


def test_the_condition_job_asks_slurm_for_the_text_encoders_memory(tmp_path):
    """UMT5-XXL in float32 on a CPU node needs ~23 GB: the slurm profile's dry run gives the
    condition job that (its default-resources give CPU stages 2 GB) as a job of its own."""
    require_slurm_plugin()
    work = wan_workdir(tmp_path / "w")
    profile = ["--workflow-profile", str(work / "wf/profiles/slurm")]
    proc = snakemake(work, *profile, "-n", "results/hop/condition/text.safetensors")
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("rule condition"))
    block = "\n".join(lines[start : start + 12])
    mem = int(block.split("mem_mb=")[1].split(",")[0])
    assert 23_000 < mem < 30_000, block
    assert "group" not in block  # not summed into the prep group job

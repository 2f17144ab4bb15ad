"""The Slurm tests' shared pieces: one test cluster per session (tests/slurm/cluster.py), a CI
site profile derived from profiles/slurm, and Snakemake runs through the real executor plugin.

The cluster needs root and the Debian Slurm packages (tests/slurm/install.sh, which CI runs;
this fixture runs it too when the packages are missing and it can). Otherwise every test here
skips with the reason.
"""

from __future__ import annotations

import csv
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from tests import components
from tests.components import require_slurm_plugin
from tests.conftest import REPO
from tests.slurm import cluster as sc
from tests.workflow import snakemake_cli

INSTALL = Path(__file__).with_name("install.sh")
TEMPLATE = REPO / "profiles/slurm"
# The node's GPU kinds stand in for the template's: its first (the fullest tier's) is `big`,
# every other `small`.
FIRST_KIND, OTHER_KIND = "big", "small"
# Host RAM (GB) of the first tier on this 24 GB node, each next one 0.25 GB less: distinct,
# so a job's --mem tells its tier, and below the oracle training's own need (~2 GB), so the
# tier's value (the ceiling) is what a job asks for.
HOST_MEM_GB, HOST_MEM_STEP = 1.5, 0.25


def _require_installed() -> None:
    """The suite installs nothing itself: .ci/run (and README "Development") runs INSTALL."""
    missing = sc.missing_commands()
    if missing:
        components.missing(components.SLURM, f"not installed ({', '.join(missing)} missing)")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The session's Slurm cluster (started once, stopped after the last Slurm test)."""
    if sys.platform != "linux" or os.geteuid() != 0:
        components.missing(
            components.SLURM_ROOT, "the test cluster runs slurmd, and munged as user munge"
        )
    _require_installed()
    require_slurm_plugin()
    try:
        cluster = sc.Cluster().start()
    except sc.ClusterError as exc:
        if "/etc/slurm/slurm.conf" in str(exc).splitlines()[0]:
            components.missing(components.SLURM, str(exc).splitlines()[0])
        raise
    print(f"\nSlurm test cluster up in {cluster.start_seconds:.1f} s ({cluster.root})")
    try:
        yield cluster
    finally:
        cluster.stop()


def write_ci_profile(folder: Path, cluster: sc.Cluster, tiers: list[str] | None = None) -> Path:
    """profiles/slurm as this cluster's site would set it: loaded from the template and
    changed only where the site differs (partition, GPU kinds, node size, fast polling);
    ``tiers``: the only tiers of the site (the workflow config's, when it has fewer)."""
    conf = yaml.safe_load((TEMPLATE / "config.yaml").read_text())
    site = yaml.safe_load((TEMPLATE / conf["configfile"]).read_text())
    if tiers is not None:
        site["tiers"] = {name: site["tiers"][name] for name in tiers}
    conf["default-resources"]["slurm_partition"] = sc.PARTITION
    # the node has 2 CPUs and 24 GB. A group job asks for its parallel members' CPUs and
    # memory summed, bounded by `cores`: one CPU per group job lets two scenes' geometry run
    # side by side
    conf["default-resources"]["mem_mb"] = 1000
    conf["cores"] = 1
    conf["latency-wait"] = 5
    # the executor's status checks: every 2 s (the plugin's default waits 40 s before the
    # first; tests/slurm/snakemake_main.py keeps this interval instead of its growing one). A
    # sacct query of this cluster takes ~0.1 s
    conf["slurm-init-seconds-before-status-checks"] = 2
    conf["slurm-status-command"] = "sacct" if cluster.accounting else "squeue"
    conf["slurm-keep-successful-logs"] = True
    kinds = list(dict.fromkeys(t.get("gpu_model") for t in site["tiers"].values()))
    for i, tier in enumerate(site["tiers"].values()):
        tier["gpu_model"] = FIRST_KIND if tier.get("gpu_model") == kinds[0] else OTHER_KIND
        tier["slurm_partition"] = sc.PARTITION
        tier["host_mem_gb"] = max(HOST_MEM_GB - HOST_MEM_STEP * i, HOST_MEM_STEP)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    (folder / conf["configfile"]).write_text(yaml.safe_dump(site, sort_keys=False))
    return folder


@pytest.fixture(scope="session")
def ci_profile(slurm_cluster, tmp_path_factory) -> Path:
    return write_ci_profile(tmp_path_factory.mktemp("ci-profile"), slurm_cluster)


def snakemake_cmd(workdir: Path, profile: Path | None, *args: str) -> list[str]:
    """Snakemake's command line: through Slurm with ``profile`` (tests/slurm/snakemake_main.py:
    the executor plugin polling at the profile's constant interval), locally without."""
    main = "tests.slurm.snakemake_main" if profile else "snakemake"
    cmd = [sys.executable, "-m", main, "--snakefile", str(REPO / "Snakefile")]
    cmd += ["--directory", str(workdir)]
    cmd += ["--workflow-profile", str(profile)] if profile else ["--cores", "2"]
    return [*cmd, *args]


def snakemake_env(cluster: sc.Cluster | None, **extra: str) -> dict:
    """The submitting Snakemake's environment; jobs get it too (sbatch --export=ALL)."""
    base = cluster.env if cluster else os.environ
    env = {k: v for k, v in base.items() if k != "CHORD_TEST_OOM_TIERS"}
    # the executor guesses the Slurm account from $USER's associations
    env.setdefault("USER", pwd.getpwuid(os.getuid()).pw_name)
    return {**env, "PYTHONPATH": str(REPO), **extra}


def run_snakemake(
    workdir: Path,
    profile: Path | None,
    *args: str,
    cluster: sc.Cluster | None = None,
    env: dict | None = None,
    check: bool = True,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """Snakemake on the repository's workflow in ``workdir``: through Slurm with ``profile``,
    or locally (default profile) without. A local run is the Slurm runs' reference: it forks
    from tests/workflow/snakemake_cli.py, its jobs through tests/workflow/job_python.py (their
    imports made once); the Slurm jobs are fresh interpreters, as on a site."""
    cmd = snakemake_cmd(workdir, profile, *args)
    full_env = snakemake_env(cluster, **(env or {}))
    if profile is None:
        proc = snakemake_cli.run(cmd[3:], cwd=workdir, env=full_env)  # after python -m snakemake
    else:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=workdir, env=full_env, timeout=timeout
        )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
            f"{proc.stderr[-8000:]}"
        )
    return proc


def wait_until(what: str, ok, timeout: float = 180, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# ----------------------------------------------------------------------------- job records
JOB_FIELDS = ("JobID", "JobName", "Comment", "State", "ReqTRES", "Timelimit", "Partition")


def run_id(log: str) -> str:
    """The executor's run id (every job's Slurm job name) from Snakemake's output."""
    m = re.search(r"SLURM run ID: (\S+)", log)
    assert m, log[-3000:]
    return m[1]


def slurm_jobs(cluster: sc.Cluster, log: str, duplicates: bool = False) -> list[dict]:
    """The Slurm jobs of the Snakemake run whose output is ``log``."""
    rid = run_id(log)
    return [j for j in cluster.sacct(*JOB_FIELDS, duplicates=duplicates) if j["JobName"] == rid]


def rule_jobs(jobs: list[dict], rule: str, scene: str | None = None) -> list[dict]:
    """Jobs of ``rule`` (the executor's comment: rule_<rule>[_wildcards_<values>])."""
    want = f"rule_{rule}_wildcards_{scene}" if scene else f"rule_{rule}"
    return [j for j in jobs if j["Comment"] == want or j["Comment"].startswith(want + "_")]


def job_number(job: dict) -> int:
    """Sort key: submission order."""
    return int(job["JobID"])


def tres(job: dict) -> dict[str, str]:
    """ReqTRES "cpu=1,gres/gpu:big=1,mem=1536M,..." as a dict."""
    return dict(item.split("=", 1) for item in job["ReqTRES"].split(",") if item)


def gpu_kinds(job: dict) -> set[str]:
    return {k.split(":", 1)[1] for k in tres(job) if k.startswith("gres/gpu:")}


def assert_same_state(state: Path, reference: dict, iterations: int) -> None:
    """The training state file ``state`` holds ``reference`` (the state of the same training
    run locally without interruption) to the bit: ``iterations`` done, its motion and its
    optimisers' states."""
    got = torch.load(state, weights_only=True)
    assert got["iteration"] == reference["iteration"] == iterations
    for key, value in reference["motion"].items():
        assert torch.equal(got["motion"][key], value), key
    for name, opt in reference["optimizers"].items():
        for i, st in opt["state"].items():
            for k, v in st.items():
                assert torch.equal(got["optimizers"][name]["state"][i][k], v), (name, i, k)


def minutes(timelimit: str) -> int:
    """Slurm's [D-]HH:MM:SS as minutes."""
    days, _, hms = timelimit.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m + (s > 0)


def ci_tiers(profile: Path, workdir: Path) -> dict:
    """The tiers a run with the CI profile sees: the workdir's config with the profile's site
    config merged over it (chord.resources.tiers.parse of the result)."""
    from chord.resources import tiers

    conf = yaml.safe_load((workdir / "config/config.yaml").read_text())
    site = yaml.safe_load((profile / "site.yaml").read_text())
    merged = {name: {**spec, **site["tiers"].get(name, {})} for name, spec in conf["tiers"].items()}
    return tiers.parse(merged)


# ----------------------------------------------------------------------------- the demo run
# The demo scenes, made small: every stage still runs, on tiny inputs.
SMALL = {
    "gs_init_num": 500,
    "surface_target_num": 500,
    "size": "64*32",
    "export_size": "64*32",
    "frame_num": 9,
    "prev_frame_number": 5,
    "back_iter": 4,
    "iterations": 12,
    "save_interval": 4,
    "early_stop": False,
}
# sway starts on the second tier (hop on the first: the run uses both GPU kinds). Memory flags
# never change results.
SHEET_TIERS = {"sway": "split"}


def small_demo(folder: Path) -> Path:
    """The shipped config and sheet (the demo scenes hop and sway), with SMALL per scene."""
    from tests.workflow.test_workflow import demo_workdir

    work = demo_workdir(folder)
    sheet = work / "config/scenes.tsv"  # hop and sway: Slurm's behaviour, not the method's
    lines = sheet.read_text().splitlines()
    sheet.write_text("".join(f"{r}\n" for r in lines if r.split("\t")[0] != "slide"))
    path = work / "config/config.yaml"
    conf = yaml.safe_load(path.read_text())
    conf["scene_overrides"] = {scene: dict(SMALL) for scene in ("hop", "sway")}
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    set_sheet_tiers(work, SHEET_TIERS)
    return work


def set_sheet_tiers(work: Path, tiers: dict[str, str]) -> None:
    sheet = work / "config/scenes.tsv"
    rows = [line.split("\t") for line in sheet.read_text().splitlines()]
    col = rows[0].index("tier")
    for row in rows[1:]:
        row[col] = tiers.get(row[0], row[col])
    sheet.write_text("\n".join("\t".join(r) for r in rows) + "\n")


def set_overrides(work: Path, **scenes: dict) -> None:
    """Change scene_overrides values of the workdir's config (e.g. hop={"iterations": 80})."""
    path = work / "config/config.yaml"
    conf = yaml.safe_load(path.read_text())
    for scene, values in scenes.items():
        conf["scene_overrides"].setdefault(scene, {}).update(values)
    path.write_text(yaml.safe_dump(conf, sort_keys=False))


def first_tier() -> str:
    return next(iter(yaml.safe_load((REPO / "config/config.yaml").read_text())["tiers"]))


@pytest.fixture(scope="session")
def slurm_demo(slurm_cluster, ci_profile, tmp_path_factory):
    """The small demo run end to end through Slurm, and the same config run locally (default
    profile) at the same time, for comparison: locally only up to what the tests compare (the
    metrics table and the trainings; no export, viewer or preview jobs). hop's training runs
    out of GPU memory on the first tier (the training's test hook CHORD_TEST_OOM_TIERS; Slurm
    jobs inherit it through sbatch --export=ALL): it escalates to the next
    (tests/slurm/test_escalation.py)."""
    root = tmp_path_factory.mktemp("demo")
    work, local = small_demo(root / "slurm"), small_demo(root / "local")
    oom = {"CHORD_TEST_OOM_TIERS": first_tier()}
    with ThreadPoolExecutor(1) as pool:  # the local run beside the Slurm run
        local_run = pool.submit(run_snakemake, local, None, "results/metrics.tsv", env=oom)
        proc = run_snakemake(work, ci_profile, cluster=slurm_cluster, env=oom)
        local_run.result(timeout=900)  # raises where it failed
    log = proc.stdout + proc.stderr
    return SimpleNamespace(
        work=work,
        local=local,
        log=log,
        jobs=slurm_jobs(slurm_cluster, log),
        profile=ci_profile,
    )


def copy_workdir(src: Path, dst: Path) -> Path:
    """A finished workdir copied with its times (its outputs stay up to date)."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


# ----------------------------------------------------------------------------- hop's long training
# hop trained anew (a new configuration) long enough to be interrupted once its loss log has
# AFTER rows, with the save points 1, 5 and 60 only (tests/slurm/test_preemption.py,
# test_time_limit.py): an interruption lands between save points 5 and 60
LONG = {"iterations": 90, "save_interval": 1000}
AFTER = 15
TARGET = "results/hop/train/coarse.pt"
CHECKPOINTS = "results/hop/checkpoints/coarse"


def long_hop(src: Path, dst: Path) -> Path:
    """The finished demo workdir ``src`` copied to ``dst``, hop's training made LONG."""
    work = copy_workdir(src, dst)
    set_overrides(work, hop=LONG)
    return work


@pytest.fixture(scope="session")
def long_reference(slurm_demo, tmp_path_factory):
    """hop's LONG training run through without interruption, locally: its workdir and state."""
    work = long_hop(slurm_demo.work, tmp_path_factory.mktemp("reference") / "w")
    run_snakemake(work, None, TARGET)
    return SimpleNamespace(work=work, state=torch.load(work / TARGET, weights_only=True))


def start(work: Path, profile: Path, cluster: sc.Cluster, *targets: str) -> subprocess.Popen:
    """Snakemake through Slurm in the background, its output in ``work``/../snakemake.log."""
    log = open(work.parent / "snakemake.log", "w")
    return subprocess.Popen(
        snakemake_cmd(work, profile, *targets),
        cwd=work,
        env=snakemake_env(cluster),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a signal meant for it reaches no test process
        # a job a shell starts in the background (as CI may be) inherits SIGINT ignored, and
        # Python then raises no KeyboardInterrupt: Snakemake would not hear the test's Ctrl-C.
        # A user's Ctrl-C reaches a Snakemake whose SIGINT is the default: restore it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(proc: subprocess.Popen, work: Path, timeout: float = 400) -> str:
    proc.wait(timeout=timeout)
    return (work.parent / "snakemake.log").read_text()


def running_training(cluster: sc.Cluster, scene: str = "hop") -> str | None:
    """The Slurm job id of the scene's training while it runs."""
    out = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i|%k").stdout
    for line in out.splitlines():
        jobid, comment = line.split("|", 1)
        if comment == f"rule_train_coarse_wildcards_{scene}":
            return jobid
    return None


def logged_iterations(work: Path, old: set[str]) -> int:
    """Rows of the long training's loss log (kept beside its configuration's checkpoints; the
    configurations ``old`` are the demo's)."""
    rows = 0
    for path in (work / CHECKPOINTS).glob("*/losses.tsv"):
        if path.parent.name not in old:
            with open(path) as f:
                rows = max(rows, sum(1 for _ in csv.DictReader(f, delimiter="\t")))
    return rows


def wait_for_logged(work: Path, cluster: sc.Cluster, demo: Path) -> tuple[str, int]:
    """Wait until hop's long training job runs and has logged AFTER iterations; return its
    job id and the iterations logged then."""
    old = {p.name for p in (demo / CHECKPOINTS).iterdir()}  # the demo's configuration
    jobid = wait_until("hop's training job", lambda: running_training(cluster), timeout=300)

    def logged():
        rows = logged_iterations(work, old)
        return rows if rows >= AFTER else None

    return jobid, wait_until(f"{AFTER} logged iterations", logged, timeout=300, every=0.1)

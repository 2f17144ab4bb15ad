"""bench/gpu_device.sh: the device machine's two calls of the GPU check, each within 540 s of
budgets (its --dry-run on a CPU). The .whl/ folder check it starts with is
tests/unit/bench/test_gpu_imports.py's; the .kernels/ folder check (part 1) is
tests/unit/bench/test_gsplat_prebuild.py's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check, gpu_imports
from tests.unit.bench.test_gsplat_prebuild import write_kernels

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "gpu_device.sh"


@pytest.fixture(autouse=True)
def wheels(tmp_path, monkeypatch):
    """A folder named as .whl/ would be (empty files: the dry run checks the names and the
    versions against bench/gpu_wheels.txt, and installs nothing)."""
    folder = tmp_path / "whl"
    folder.mkdir()
    for name, version in gpu_imports.carried_wheels().items():
        (folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").touch()
    monkeypatch.setenv("WHEELS_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def kernels(wheels, tmp_path, monkeypatch):
    """A .kernels/ folder built for the pins from the gsplat wheel in ``wheels``."""
    folder = tmp_path / "kernels"
    write_kernels(folder, wheels)
    monkeypatch.setenv("KERNELS_DIR", str(folder))
    return folder


def dry_run(*args, **env):
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, **env},
        timeout=60,
    )


def plan(part: int) -> tuple[dict[str, int], int, list[str]]:
    """({step: budget}, the printed sum, the check's arguments) of a part's dry run."""
    proc = dry_run("--part", str(part))
    assert proc.returncode == 0, proc.stderr
    first, *rest = proc.stdout.splitlines()
    lines = dict(line.split(": ", 2)[1:] for line in rest if line.startswith("part "))
    steps = {name: int(s) for name, s in (step.split() for step in first[8:].split(", "))}
    total = int(re.fullmatch(r"(\d+) s \(limit 540 s.*", lines["budget sum"])[1])
    args = shlex.split(lines["check"].split(" (torch")[0])
    return steps, total, args


def test_each_part_sums_its_budgets_within_540_s_and_the_sections_are_the_checks():
    sections = {}
    for part in (1, 2):
        steps, total, args = plan(part)
        assert total == sum(steps.values()) <= 540, (part, steps)
        assert {"install", "facts", "setup"} <= set(steps)
        assert ("build" in steps) == (part == 1)  # part 2 trains on the torch rasteriser
        assert args[:3] == ["bench/gpu_check.py", "--json", f"$OUT/part{part}-check.json"]
        # the arguments are the check's: its parser takes them, each section's budget is
        # gpu_check.BUDGETS' in its part and 0 in the other
        budgets = [args[i + 1] for i, a in enumerate(args) if a == "--budget"]
        parsed = gpu_check.parse_budgets(budgets)
        for name, seconds in parsed.items():
            if name in steps:
                assert seconds == gpu_check.BUDGETS[name] == steps[name]
                sections[name] = part
            else:
                assert seconds == 0
    assert sorted(sections) == sorted(gpu_check.BUDGETS)  # every section in one of the parts
    assert "--render-backend torch" in " ".join(plan(2)[2])


def test_a_plan_over_540_s_is_refused():
    steps, total, _ = plan(1)
    proc = dry_run("--part", "1", LINK_S=str(steps["build"] + 541 - total))
    assert proc.returncode == 1
    assert "part 1: the budgets sum to 541 s, over 540 s: lower them" in proc.stderr


@pytest.mark.parametrize(
    "args, error",
    [(["--part", "3"], "--part: 1 or 2, got '3'"), (["--parts", "1"], "bash bench/gpu_device.sh")],
)
def test_a_bad_argument_is_an_error(args, error):
    proc = dry_run(*args)
    assert proc.returncode == 2 and error in proc.stderr


def test_a_missing_or_stale_wheel_folder_is_refused_here(wheels, tmp_path):
    """The device has no network: the dry run here refuses what the device could not install."""
    proc = dry_run("--part", "1", WHEELS_DIR=str(tmp_path / "none"))
    assert proc.returncode == 1 and "bash bench/gpu_device.sh --fetch-wheels" in proc.stderr
    next(wheels.glob("wcwidth-*")).rename(wheels / "wcwidth-0.0.1-py3-none-any.whl")
    proc = dry_run("--part", "2")
    assert proc.returncode == 1 and "wcwidth-0.0.1-py3-none-any.whl: not in gpu_wheels.txt" in (
        proc.stdout + proc.stderr
    )


def test_part_1_links_the_carried_kernels_and_plans_the_jit_build_only_without_them(
    kernels, tmp_path
):
    """With current .kernels/ the build step is their link (LINK_S), and the plan says a JIT
    build (BUILD_S) comes only if they fail; on the device, without them, it is the JIT build.
    The dry run here refuses a missing or stale folder (as a stale .whl/) before a device
    second is spent; part 2 needs none."""
    proc = dry_run("--part", "1", LINK_S="33", BUILD_S="155")
    assert proc.returncode == 0, proc.stderr
    assert "build 33," in proc.stdout.splitlines()[0]
    assert "gsplat 1.5.3's 2 objects for sm_90, torch 2.11.0+cu130" in proc.stdout
    assert "build = link 33 s (a JIT build, 155 s, only if they fail to load" in proc.stdout
    for folder in (tmp_path / "none", kernels):
        if folder == kernels:
            write_kernels(kernels, gsplat="1.5.2")
        proc = dry_run("--part", "1", KERNELS_DIR=str(folder))
        assert proc.returncode == 1 and proc.stdout.count("\n") == 0
        assert "python bench/gsplat_prebuild.py build --cache DIR" in proc.stderr
    assert "gsplat: built for '1.5.2', the pins say '1.5.3'" in proc.stderr
    assert dry_run("--part", "2", KERNELS_DIR=str(tmp_path / "none")).returncode == 0
    # the device (no --dry-run; here it stops at the unset $OUT, after the plan) plans the JIT
    # build when the folder is not current
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(PYTHON=sys.executable, KERNELS_DIR=str(tmp_path / "none"), BUILD_S="150")
    proc = subprocess.run(["bash", str(SCRIPT), "--part", "1"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and "OUT: the folder whose files come back" in proc.stderr
    assert "build 150," in proc.stdout and "no manifest.json" in proc.stdout
    assert "build = JIT 150 s" in proc.stdout

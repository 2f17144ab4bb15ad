"""The DAG build loads no torch (README "Many scenes"): Snakemake's own interpreter, on the
demo config and on the Wan teacher's memory model, plans every job without importing it. Nor
trimesh (and the scipy it brings): about 2 s of every dry run's start-up (bench/dag.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.workflow.test_scale import wan_workdir
from tests.workflow.test_workflow import demo_workdir

# Snakemake's CLI in this interpreter, then what it imported; nothing else runs in it.
PROBE = """
import json, sys
from snakemake.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "safetensors.torch", "diffusers") if m in sys.modules)
meshes = sorted(m for m in ("trimesh", "scipy") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy, "meshes": meshes}), file=sys.stderr)
"""


def dry_run_imports(snakefile, workdir, pythonpath) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "--snakefile", str(snakefile), "--directory",
         str(workdir), "--cores", "2", "-n"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(pythonpath)},
    )  # fmt: skip
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Job stats" in proc.stdout + proc.stderr
    return result


def test_the_demo_dry_run_imports_no_torch(tmp_path):
    result = dry_run_imports(REPO / "Snakefile", demo_workdir(tmp_path), REPO)
    assert result["heavy"] == []
    assert result["meshes"] == []


def test_the_wan_teachers_dry_run_imports_no_torch(tmp_path):
    """The memory model sizes the Wan jobs from config files (A14B's shapes here) and the
    Tiny VAE's weights file, which the DAG build reads without the model's libraries."""
    work = wan_workdir(tmp_path / "w")
    result = dry_run_imports(work / "wf/Snakefile", work, work / "wf")
    assert result["heavy"] == []
    assert result["meshes"] == []

"""Shared fixtures: tiny scenes written as GLB, and workflow configs in a temporary folder."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import trimesh
import yaml

from tests import components, parallel

REPO = Path(__file__).resolve().parents[1]
# Third-party glTF files the tests read, through the khronos fixture (sources and licences in its
# README.md).
KHRONOS = REPO / "tests" / "data" / "khronos"
KHRONOS_FILES = ("Duck.glb", "BoxTextured.glb")


# The suite's tiers follow its folders, so a new test file cannot miss its marker:
# `pytest -m "not slow"` (unit and stage tests) is the developer's loop; tests that start
# processes (ranks, torchrun, signals, a browser, a tier's whole faked iteration), workflow runs
# and the Slurm cluster are slow.
FOLDER_MARKERS = {
    "browser": ("slow", "browser"),
    "fake_cuda": ("slow", "fake_cuda"),
    "processes": ("slow", "processes"),
    "workflow": ("slow",),
    "slurm": ("slow", "slurm"),
}
MARKERS = {
    "slow": "starts processes or a browser, runs Snakemake end to end or a Slurm cluster",
    "processes": "starts processes: gloo ranks, torchrun, signals and kills, whole programs",
    "slurm": "runs jobs on a real single-node Slurm cluster the tests start",
    "browser": "loads the viewer pages in a headless Chromium (SwiftShader's WebGL)",
    "fake_cuda": "runs the GPU path on a faked cuda:0 (chord.checks.fake_cuda)",
}


def pytest_configure(config):
    """Registers each marker with the folders that carry it (from FOLDER_MARKERS); in an xdist
    worker, gives torch the worker's share of the CPUs (tests/parallel.py)."""
    for name, what in MARKERS.items():
        folders = ", ".join(f"tests/{f}" for f, marks in FOLDER_MARKERS.items() if name in marks)
        config.addinivalue_line("markers", f"{name}: {what} ({folders})")
    parallel.share_threads()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return parallel.workers(parallel.cpus(), parallel.available_gb())


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).resolve().parent
    for item in items:
        path = Path(item.path).resolve()
        parts = path.relative_to(tests).parts if path.is_relative_to(tests) else ()
        for name in FOLDER_MARKERS.get(parts[0], ()) if len(parts) > 1 else ():
            item.add_marker(name)
    parallel.mark_groups(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CHORD_CI a skip is a failure unless it names a component CI cannot provide (a
    CUDA GPU; the CPU-only paths on a GPU machine): see tests/components.py."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and components.in_ci()) or hasattr(report, "wasxfail"):
        return
    text = skip_reason(report)
    found = components.classify(text)
    if found is None or found.ci:
        why = "names no known component" if found is None else "is one .ci/run installs"
        report.outcome = "failed"
        report.longrepr = f"skipped under CHORD_CI, and the skip {why}: {text}"


def skip_reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    """The time each tier took (quick: ``-m "not slow"``; slow), beside pytest's slowest 25
    (``--durations=25`` in pyproject.toml), so growth shows where it happens; then the skips
    grouped by what is missing, each with the command that brings it."""
    spent: dict[str, float] = {}
    counted: dict[str, set] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) is None or not hasattr(r, "duration"):
                continue
            tier = "slow" if "slow" in r.keywords else "quick"
            spent[tier] = spent.get(tier, 0.0) + r.duration
            counted.setdefault(tier, set()).add(r.nodeid)
    terminalreporter.section("time by tier (set-up, call and tear-down summed)")
    for tier in sorted(spent):
        minutes, seconds = divmod(spent[tier], 60)
        terminalreporter.write_line(
            f"{tier}: {len(counted[tier])} tests, {int(minutes)} min {seconds:.0f} s"
        )
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    terminalreporter.section("skips by missing component")
    for line in components.summary([skip_reason(r) for r in skipped]):
        terminalreporter.write_line(line)


def box(extents, centre, colour=(200, 80, 40, 255)) -> trimesh.Trimesh:
    mesh = trimesh.creation.box(extents=extents)
    mesh.apply_translation(centre)
    mesh.visual.face_colors = colour
    return mesh


def write_scene(folder: Path, meshes: list[trimesh.Trimesh]) -> Path:
    """CHORD layout: obj_<i>.glb per mesh and scene.glb holding them all."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, mesh in enumerate(meshes):
        trimesh.Scene(mesh).export(folder / f"obj_{i}.glb", file_type="glb")
    trimesh.Scene(meshes).export(folder / "scene.glb", file_type="glb")
    return folder


def write_still_motion(folder: Path, objects=("obj_0",), frame_num: int = 21) -> Path:
    """A scripted motion.json in which ``objects`` stand still: what the oracle teacher needs
    to plan a training of one's own scene (a test about something else)."""
    still = {
        "deformation": {"kind": "none"},
        "rigid": {
            "pivot": [0.0, 0.0, 0.0],
            "rotations": [[1.0, 0.0, 0.0, 0.0]] * frame_num,
            "translations": [[0.0, 0.0, 0.0]] * frame_num,
        },
    }
    doc = {
        "format": "chord-scripted-motion/1",
        "frame_num": frame_num,
        "fps": 16,
        "space": "world",
        "up": [0.0, 1.0, 0.0],
        "objects": {name: still for name in objects},
    }
    path = Path(folder) / "motion.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def toy_scene(tmp_path) -> Path:
    """A block (obj_0, dynamic) standing on a slab (obj_1, static)."""
    return write_scene(
        tmp_path / "data" / "toy",
        [box([0.4, 0.8, 0.4], [0, 0.45, 0]), box([2.0, 0.1, 2.0], [0, 0, 0], (90, 90, 90, 255))],
    )


def write_config(folder: Path, rows: list[dict], **extra) -> Path:
    """config.yaml + scenes.tsv in ``folder``; ``extra`` entries are merged into the config."""
    folder.mkdir(parents=True, exist_ok=True)
    cols = ["scene", "data", "prompt", "n_prompt", "gaussians", "tier", "preset"]
    lines = ["\t".join(cols)] + ["\t".join(str(r.get(c, "")) for c in cols) for r in rows]
    (folder / "scenes.tsv").write_text("\n".join(lines) + "\n")
    conf = {"scenes": str(folder / "scenes.tsv"), "results": str(folder / "results")}
    for key, value in extra.items():
        conf[key] = value
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


@pytest.fixture
def khronos() -> Path:
    """The vendored Khronos sample models (Duck.glb, BoxTextured.glb). Where one is missing or
    is no GLB (a partial copy of the repository), the test skips saying so (fails under
    CHORD_CI) instead of failing on an error unrelated to what it tests."""
    for name in KHRONOS_FILES:
        try:
            with open(KHRONOS / name, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            magic = repr(exc)
        if magic != b"glTF":
            components.missing(components.TEST_DATA, f"{KHRONOS / name} is missing or no GLB")
    return KHRONOS


def copy_glb(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)


def empty_glb() -> bytes:
    """A valid GLB container whose scene holds no mesh."""
    doc = json.dumps({"asset": {"version": "2.0"}, "scenes": [{"nodes": []}], "scene": 0})
    chunk = doc.encode().ljust((len(doc) + 3) // 4 * 4, b" ")
    body = struct.pack("<II", len(chunk), 0x4E4F534A) + chunk
    return struct.pack("<4sII", b"glTF", 2, 12 + len(body)) + body


def nan_mesh() -> trimesh.Trimesh:
    mesh = trimesh.creation.box(extents=[1, 1, 1])
    verts = mesh.vertices.copy()
    verts[0] = np.nan
    return trimesh.Trimesh(verts, mesh.faces, process=False)


# --- the Khronos glTF validator ---------------------------------------------------------

VALIDATE_JS = """
const fs = require('fs');
const validator = require(process.argv[2]);
validator.validateBytes(new Uint8Array(fs.readFileSync(process.argv[3])), {maxIssues: 100})
  .then((r) => console.log(JSON.stringify(r.issues)),
        (e) => { console.error(String(e)); process.exit(2); });
"""


@pytest.fixture(scope="session")
def gltf_validator() -> Path:
    """The Khronos glTF validator (npm package gltf-validator): $CHORD_GLTF_VALIDATOR, else
    tests/tools' (`cd tests/tools && npm ci`)."""
    if shutil.which("node") is None:
        components.missing(components.NODE, "the Khronos glTF validator runs on it")
    tools = REPO / "tests" / "tools" / "node_modules" / "gltf-validator"
    module = Path(os.environ.get("CHORD_GLTF_VALIDATOR") or tools)
    if not (module / "package.json").is_file():
        components.missing(components.NPM_TOOLS, f"gltf-validator not installed ({module})")
    return module


def validate_glb(module: Path, path: Path, tmp_path: Path) -> dict:
    """The validator's issue report of a GLB: numErrors, numWarnings, messages, ..."""
    script = tmp_path / "validate.js"
    script.write_text(VALIDATE_JS)
    proc = subprocess.run(
        ["node", str(script), str(module), str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


#: the mark of a test that runs :func:`assert_npm_build_is_committed`
needs_npm_build = components.skip_without(
    components.NODE,
    bool(shutil.which("node") and shutil.which("npm")),
    "node and npm build the bundle that is checked against src/",
)


def assert_npm_build_is_committed(folder: Path, bundle: Path, tmp_path: Path) -> None:
    """`npm ci && npm run build` on a copy of the npm package ``folder`` (its package files
    and src/) gives the committed ``bundle`` (in its dist/)."""
    for name in ("package.json", "package-lock.json"):
        shutil.copy(folder / name, tmp_path / name)
    shutil.copytree(folder / "src", tmp_path / "src")
    for cmd in (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build"]):
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    where = bundle.relative_to(folder)
    assert (tmp_path / where).read_bytes() == bundle.read_bytes(), (
        f"{bundle} is not the build of {folder / 'src'}: run `npm ci && npm run build` in "
        f"{folder.name} and commit {where}"
    )

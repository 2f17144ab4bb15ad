"""bench/gpu_imports.py and the lists it reads: the GPU image's packages and the carried wheels
(bench/gpu_wheels.txt) meet the check's and the training's imports; the wheels' versions are
the lock's (tests/unit/bench/test_lock.py).

The GPU check's --tiny run under the guard is tests/unit/bench/test_gpu_check.py's; one training
iteration under it is here."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from bench import gpu_imports as mod
from bench import lock

ROOT = Path(__file__).resolve().parents[3]
GUARD = ROOT / "bench" / "gpu_imports.py"


# --- the lists ----------------------------------------------------------------------------------


def test_the_wheels_are_pinned_and_none_is_on_the_image():
    image, wheels = mod.image_packages(), mod.carried_wheels()
    assert {"torch", "transformers", "pillow", "pyyaml", "scikit-learn"} <= set(image)
    assert image["torch"] == "2.11.0" and image["huggingface-hub"] == "1.33.0"
    assert all(wheels.values())
    assert not set(wheels) & set(image), "a wheel the image has: carry it only for a reason"
    # what the check's import chain needed and the old hand list lacked
    assert {"libigl", "wcwidth", "diffusers", "mmgp", "optimum-quanto", "gsplat"} <= set(wheels)


def test_each_wheels_requirements_are_on_the_image_or_carried():
    """pip installs the wheels with --no-deps there: what each one needs on the device (the
    lock's own graph, at the device's markers) must be on the image or carried. Where the
    installed copy is the carried version, its declared ranges must also admit the image's
    versions (a copy outside the lock says nothing of the carried one's ranges)."""
    image, wheels = mod.image_packages(), mod.carried_wheels()
    entries = [e for e in lock.read(lock.TEST_LOCK) if e.applies(mod.DEVICE_MARKERS)]
    problems = []
    for name in wheels:
        for dep in sorted({e.name for e in entries if name in e.via}):
            if dep not in wheels and dep not in image and dep not in mod.NOT_CARRIED:
                problems.append(f"{name} needs {dep}: neither on the image nor carried")
        if importlib.metadata.version(name) != wheels[name]:
            continue
        for line in importlib.metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(mod.DEVICE_MARKERS):
                continue
            dep = mod.canonical(req.name)
            there = wheels.get(dep) or image.get(dep)
            if dep in mod.NOT_CARRIED:
                continue
            if dep not in wheels and dep not in image:
                problems.append(f"{name} needs {req}: neither on the image nor carried")
            elif there is not None and not req.specifier.contains(there, prereleases=True):
                problems.append(f"{name} needs {req}; the device has {dep} {there}")
    assert not problems, problems


@pytest.mark.parametrize(
    "text, error",
    [
        ("diffusers==0.42.1\n\nfoo bar\n", "gpu_wheels.txt:3: 'foo bar': expected NAME"),
        ("diffusers==0.42.1\nDiffusers==0.42.0\n", "gpu_wheels.txt:2: 'Diffusers==0.42.0': "),
        (
            "# the pipeline\ndiffusers  # CI\n",
            "gpu_wheels.txt:2: 'diffusers  # CI': expected NAME==",
        ),
    ],
)
def test_a_bad_line_is_named(tmp_path, text, error):
    path = tmp_path / "gpu_wheels.txt"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        mod.carried_wheels(path)
    assert error in str(info.value)


def test_distribution_names_map_to_their_import_names():
    """packages_distributions of this environment: pillow is PIL, pyyaml yaml, scikit-learn
    sklearn, libigl igl; the standard library, chord and modules of no distribution pass."""
    guard = mod.DeviceImportGuard(mod.image_packages(), mod.carried_wheels())
    for name in ("PIL", "yaml", "sklearn", "numpy", "igl", "optimum", "json", "chord", "fixtures"):
        assert guard.blocked(name) is None, name
    assert guard.blocked("imageio_ffmpeg") == ["imageio-ffmpeg"]
    assert guard.blocked("rtree") == ["rtree"]


def test_the_wheel_folder_must_hold_the_listed_wheels_alone(tmp_path):
    wheels = tmp_path / "gpu_wheels.txt"
    wheels.write_text("diffusers==0.42.1\nrpds-py==2026.9.1\n")
    folder = tmp_path / ".whl"
    folder.mkdir()
    (folder / "diffusers-0.42.1-py3-none-any.whl").touch()
    assert mod.wheel_folder_problems(folder, wheels) == [f"rpds-py==2026.9.1: no wheel in {folder}"]
    (folder / "rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.whl").touch()
    assert mod.wheel_folder_problems(folder, wheels) == []
    (folder / "diffusers-0.35.2-py3-none-any.whl").touch()
    (folder / "notes.txt").touch()
    assert mod.wheel_folder_problems(folder, wheels) == [
        "diffusers-0.35.2-py3-none-any.whl: not in gpu_wheels.txt (it has diffusers==0.42.1)",
        "notes.txt: not a wheel",
    ]


# --- the guard ----------------------------------------------------------------------------------


@pytest.fixture
def guard():
    modules = {"numpy": ["numpy"], "trimesh": ["trimesh"], "igl": ["libigl"], "yaml": ["PyYAML"]}
    return mod.DeviceImportGuard(["numpy"], ["trimesh"], modules)


def test_an_import_neither_on_the_image_nor_carried_raises_naming_it(guard):
    for name in ("numpy", "trimesh", "json", "chord", "unknown_local_module"):
        assert guard.find_spec(name) is None, name
    assert guard.find_spec("igl.helpers", ["/somewhere"]) is None  # the parent decides
    with pytest.raises(ModuleNotFoundError) as info:
        guard.find_spec("igl")
    assert info.value.name == "igl"
    msg = str(info.value)
    assert msg.startswith(f"igl (from libigl, imported by {__name__}) is neither on the GPU image")
    assert "bench/gpu_wheels.txt" in msg and "bench/gpu_image_packages.txt" in msg
    with pytest.raises(ModuleNotFoundError, match=r"^yaml \(from pyyaml"):
        guard.find_spec("yaml")


def test_the_images_packages_import_what_they_need(guard):
    """An import by an image package (its version there meets its own needs), and by what it
    imported so, goes through; a carried wheel's import does not."""

    def find_spec_from(module, name):
        scope = {"__name__": module, "guard": guard}
        exec(f"result = guard.find_spec({name!r})", scope)
        return scope["result"]

    assert find_spec_from("numpy.linalg", "igl") is None
    assert guard.image_side == {"igl"}
    assert find_spec_from("igl._core", "yaml") is None  # what igl, let through, imports
    with pytest.raises(ModuleNotFoundError, match="imported by trimesh.exchange"):
        find_spec_from("trimesh.exchange", "yaml")


def test_the_probe_answers_none_for_a_blocked_module(guard):
    asked = []

    def find_spec(name, package=None):
        asked.append(name)
        return "spec"

    probe = guard.probe(find_spec)
    assert probe("igl") is None and probe("numpy") == "spec" and probe("igl.x") == "spec"
    assert asked == ["numpy", "igl.x"]


def test_install_and_uninstall():
    import importlib.util

    original = importlib.util.find_spec
    guard = mod.install()
    try:
        assert sys.meta_path[0] is guard and importlib.util.find_spec is not original
        assert importlib.util.find_spec("imageio_ffmpeg") is None
        assert importlib.util.find_spec("json") is not None
    finally:
        mod.uninstall(guard)
    assert guard not in sys.meta_path and importlib.util.find_spec is original

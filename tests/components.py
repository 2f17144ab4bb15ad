"""What a skipped test lacks, named once: each component a test may skip without, and the
command that brings it.

A test that cannot run here calls :func:`missing` (or carries :func:`skip_without`); its skip
reason starts with the component's label, so the end of a run can group the skips by what is
missing (``pytest_terminal_summary`` in tests/conftest.py) and a user sees, in one place, which
command turns them into runs. Under ``CHORD_CI`` a skip for a component that .ci/run installs,
or for no known component at all, is a failure: there a skip would hide a gap."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Component:
    label: str  # the skip reason's first words
    install: str  # what brings it
    ci: bool  # .ci/run provides it: its absence under CHORD_CI fails the test


NODE = Component("Node.js", "apt-get install nodejs (Node 18 or later)", ci=True)
NPM_TOOLS = Component("npm test tools", "cd tests/tools && npm ci", ci=True)
CHROMIUM = Component("Chromium", "apt-get install chromium", ci=True)
SLURM = Component("Slurm", "sudo bash tests/slurm/install.sh", ci=True)
SLURM_ROOT = Component("Slurm needs root", "run the tests as root: sudo .venv/bin/pytest", ci=True)
SLURM_PLUGIN = Component("Slurm executor plugin", "pip install -e '.[test]'", ci=True)
CXX = Component("C++ compiler", "apt-get install g++ (or set CXX)", ci=True)
CUDA = Component("CUDA GPU", "a machine with an NVIDIA GPU and a CUDA build of torch", ci=False)
CPU_ONLY = Component("CPU-only paths", "they check what a machine without CUDA says", ci=False)
TENSORBOARD = Component("TensorBoard", "pip install -e '.[test]'", ci=True)
MKDOCS = Component(
    "MkDocs", "pip install --require-hashes -r requirements/test.txt (the docs extra)", ci=True
)
# bpy in a venv of its own: it pins numpy<2 (the project's pandas needs numpy 2) and its wheel
# is 374 MB (821 MB installed), so neither the `test` extra nor .ci/run brings it.
BLENDER = Component(
    "Blender's bpy",
    "python3.11 -m venv .venv-bpy && .venv-bpy/bin/pip install bpy==5.0.1 "
    "(or CHORD_BPY_PYTHON=<a Python with bpy>)",
    ci=False,
)
# the repository's own test files (tests/data): missing in a partial copy of it
TEST_DATA = Component("test data", "a full clone of the repository (git tracks it)", ci=True)

COMPONENTS = (
    NODE, NPM_TOOLS, CHROMIUM, SLURM, SLURM_ROOT, SLURM_PLUGIN, TENSORBOARD, MKDOCS, TEST_DATA, CXX,
    CUDA, CPU_ONLY, BLENDER,
)  # fmt: skip


def reason(component: Component, detail: str) -> str:
    return f"{component.label}: {detail}"


def in_ci() -> bool:
    return bool(os.environ.get("CHORD_CI"))


def missing(component: Component, detail: str, *, module: bool = False):
    """Skip the running test for want of ``component`` (``detail`` says what exactly), or with
    ``module`` the test module being collected; fail instead under CHORD_CI when .ci/run
    installs it."""
    text = reason(component, detail)
    if component.ci and in_ci():
        pytest.fail(f"{text} (CHORD_CI: .ci/run installs it: {component.install})")
    pytest.skip(text, allow_module_level=module)


def skip_without(component: Component, present: bool, detail: str):
    """The mark form of :func:`missing`, for a condition known at collection."""
    return pytest.mark.skipif(not present, reason=reason(component, detail))


def classify(text: str) -> Component | None:
    """The component a skip reason names, or None."""
    text = text.removeprefix("Skipped: ")
    return next((c for c in COMPONENTS if text.startswith(c.label + ":")), None)


def summary(reasons: list[str]) -> list[str]:
    """One line per component (absent ones too, as 0), then any skip no component explains."""
    counts = {c: 0 for c in COMPONENTS}
    other: dict[str, int] = {}
    for text in reasons:
        found = classify(text)
        if found is None:
            other[text] = other.get(text, 0) + 1
        else:
            counts[found] += 1
    lines = [f"skipped {n} ({c.label}: {c.install})" for c, n in counts.items() if n]
    absent = [c.label for c, n in counts.items() if not n]
    if absent:
        lines.append("skipped 0 (" + ", ".join(absent) + ")")
    lines += [f"skipped {n} (no component: {text})" for text, n in other.items()]
    return lines


def require_slurm_plugin() -> None:
    """Snakemake's Slurm executor plugin (the `test` extra brings it)."""
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError as exc:
        missing(SLURM_PLUGIN, f"snakemake_executor_plugin_slurm does not import ({exc})")

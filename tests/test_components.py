"""The skip summary and its CI rule (tests/components.py, the hooks in tests/conftest.py), on a
throwaway test file run by a second pytest."""

import os
import subprocess
import sys

import pytest

from tests import components
from tests.conftest import REPO

SAMPLE = """
import pytest
from tests import components

def test_needs_a_gpu():
    components.missing(components.CUDA, "parity runs its kernels")

def test_needs_chromium():
    components.missing(components.CHROMIUM, "pages load in it")

def test_skips_for_no_known_reason():
    pytest.skip("flaky here")

@pytest.mark.skipif(True, reason="Node.js: the bundle builds with it")
def test_marked():
    pass

@pytest.mark.xfail(reason="a known limit", strict=True)
def test_known_limit():
    assert False
"""


def run_sample(tmp_path, ci: bool) -> str:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CHORD_CI"}
    if ci:
        env["CHORD_CI"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "tests.conftest",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.stdout + proc.stderr


def test_the_summary_groups_skips_by_component_with_the_command_that_brings_it(tmp_path):
    out = run_sample(tmp_path, ci=False)
    assert "4 skipped, 1 xfailed" in out
    assert f"skipped 1 (CUDA GPU: {components.CUDA.install})" in out
    assert f"skipped 1 (Chromium: {components.CHROMIUM.install})" in out
    assert f"skipped 1 (Node.js: {components.NODE.install})" in out
    assert "skipped 1 (no component: flaky here)" in out
    zero = next(line for line in out.splitlines() if line.startswith("skipped 0 ("))
    assert "Slurm needs root" in zero and "CUDA GPU" not in zero


def test_under_ci_only_what_ci_cannot_have_may_skip(tmp_path):
    """A GPU skip stays a skip; a missing tool CI installs, a skip marked for it, and a skip
    naming no component fail (the mark at setup, so as an error); an expected failure stays
    one."""
    out = run_sample(tmp_path, ci=True)
    assert "2 failed, 1 skipped, 1 xfailed, 1 error" in out, out
    assert "the skip is one .ci/run installs: Node.js: the bundle builds with it" in out
    assert "skipped 1 (CUDA GPU" in out
    assert "the skip names no known component: flaky here" in out


@pytest.mark.parametrize("component", components.COMPONENTS, ids=lambda c: c.label)
def test_every_component_is_classified_by_its_own_reason(component):
    assert components.classify(components.reason(component, "x")) is component
    assert components.classify("Skipped: " + components.reason(component, "x")) is component

"""The code style CI enforces: ruff lint and format over the package, tests and benchmarks."""

import subprocess
import sys

from tests.conftest import REPO

TARGETS = ["chord", "tests", "bench"]


def test_ruff_check():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", *TARGETS], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *TARGETS],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

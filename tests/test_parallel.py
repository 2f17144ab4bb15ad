"""The suite's schedule under pytest-xdist (tests/parallel.py): what must share a worker does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import parallel
from tests.conftest import REPO


class Groups:
    """A plugin that records each collected test's xdist group."""

    def __init__(self):
        self.of: dict[str, str] = {}

    def pytest_collection_finish(self, session):
        for item in session.items:
            self.of[item.nodeid] = item.get_closest_marker("xdist_group").args[0]


@pytest.fixture(scope="module")
def collected() -> dict[str, str]:
    """tests/slurm and tests/workflow, collected as the suite collects them (in this process:
    their modules' imports are mostly paid already)."""
    recorder = Groups()
    folders = ["tests/slurm", "tests/workflow"]
    args = ["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "--rootdir", str(REPO)]
    code = pytest.main([*args, *(str(REPO / f) for f in folders)], plugins=[recorder])
    assert code == 0
    return recorder.of


def modules(groups: dict[str, str], folder: str) -> dict[str, set[str]]:
    """group -> the modules of ``folder`` in it."""
    found: dict[str, set[str]] = {}
    for node, group in groups.items():
        module = node.split("::", 1)[0]
        if module.startswith(folder):
            found.setdefault(group, set()).add(module)
    return found


def test_every_slurm_test_runs_on_one_worker_so_one_cluster_starts(collected):
    """Every module there uses the session's cluster; two workers would start two."""
    slurm = modules(collected, "tests/slurm/")
    assert len(slurm) == 1 and len(next(iter(slurm.values()))) >= 6


def test_the_modules_that_read_the_finished_workflow_share_it(collected):
    workflow = modules(collected, "tests/workflow/")
    users = {"tests/workflow/test_scale.py", "tests/workflow/test_sources.py"}
    together = [members for members in workflow.values() if users <= members]
    assert together, workflow
    # and a module with no shared session fixture is a group of its own
    assert {"tests/workflow/test_dag_build.py"} in workflow.values()


def test_a_module_is_never_split_across_workers(collected):
    for folder in ("tests/slurm/", "tests/workflow/"):
        for node, group in collected.items():
            module = node.split("::", 1)[0]
            if module.startswith(folder):
                assert all(g == group for n, g in collected.items() if n.startswith(module + "::"))


SHARED = """
import pytest

@pytest.fixture(scope="session")
def cluster():
    return "started once"
"""
RECORD = """
import os, pytest

@pytest.mark.parametrize("i", range(4))
def test_{name}(i, {fixture}):
    with open({out!r}, "a") as f:
        f.write("{name} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_two_workers_run_the_modules_that_share_a_conftest_fixture_on_one(tmp_path):
    """The groups reach xdist's scheduler (pytest 9.2 with xdist 3.8 dropped them silently:
    pytest-xdist#1386): a sample suite run with two workers."""
    out = tmp_path / "ran.txt"
    shared = tmp_path / "sample" / "shared"
    shared.mkdir(parents=True)
    (shared / "conftest.py").write_text(SHARED)
    for name in "abcdef":  # a, b, c share `cluster`; d, e, f stand alone
        folder, fixture = (shared, "cluster") if name in "abc" else (shared.parent, "tmp_path")
        text = RECORD.format(name=name, fixture=fixture, out=str(out))
        (folder / f"test_{name}.py").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "tests.conftest",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path / "sample")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran: dict[str, set[str]] = {}
    for line in out.read_text().splitlines():
        name, worker = line.split()
        ran.setdefault(name, set()).add(worker)
    assert all(len(workers) == 1 for workers in ran.values()), ran  # a module on one worker
    assert ran["a"] == ran["b"] == ran["c"], ran  # the modules sharing `cluster` together


@pytest.mark.parametrize(
    ("cpus", "memory_gb", "expected"),
    [(2, 24.0, 2), (64, 16.0, int(16 // parallel.WORKER_GB)), (8, 1.0, 1), (4, None, 4)],
)
def test_auto_workers_are_the_cpus_that_memory_can_hold(cpus, memory_gb, expected):
    assert parallel.workers(cpus, memory_gb) == expected


def test_each_worker_gets_its_share_of_the_cpus_and_never_none():
    assert parallel.thread_share(2, 2) == 1 and parallel.thread_share(16, 4) == 4
    assert parallel.thread_share(1, 2) == 1

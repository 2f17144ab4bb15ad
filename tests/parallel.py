"""How the suite shares the machine under pytest-xdist (``-n auto --dist loadgroup`` in
pyproject.toml's addopts; ``-n 0`` runs it in one process, for a debugger or one test).

- **Groups.** Every test of a module runs on one worker, so a module-scoped fixture is made
  once. Modules that use the same session fixture of a folder's conftest (the Slurm cluster and
  its demo run in tests/slurm, the finished workflow in tests/workflow) join one group, so that
  fixture too is made once, and the one Slurm cluster is never started twice. The groups are
  derived from the fixtures each test uses, not listed.
- **Workers.** One per CPU this process may use, fewer when memory is short: a worker's tests
  hold up to :data:`WORKER_GB` (a Wan test model, a Chromium, a Snakemake run beside it).
- **Threads.** Each worker's torch gets its share of the CPUs (at least one), so two workers on
  two cores do not each start two compute threads; the processes a test starts get the same
  share through ``OMP_NUM_THREADS`` unless the test sets its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: host memory a worker may hold at its peak (GB): measured peaks of the heaviest quick tests
#: (the faked-CUDA iteration, the viewer's Chromium) are under 2 GB; 3 leaves room for the OS
WORKER_GB = 3.0

ROOT_CONFTEST = Path(__file__).resolve().with_name("conftest.py")


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def available_gb() -> float | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def workers(cpu_count: int, memory_gb: float | None) -> int:
    """``-n auto``: a worker per CPU, as many as ``memory_gb`` holds at :data:`WORKER_GB` each."""
    if memory_gb is None:
        return max(cpu_count, 1)
    return max(1, min(cpu_count, int(memory_gb // WORKER_GB)))


def thread_share(cpu_count: int, worker_count: int) -> int:
    return max(1, cpu_count // max(worker_count, 1))


def share_threads() -> None:
    """In an xdist worker: torch and the processes its tests start use the worker's share."""
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if count is None:
        return
    threads = thread_share(cpus(), int(count))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if "torch" not in sys.modules and os.environ["OMP_NUM_THREADS"] == str(threads):
        return  # torch, once a test imports it, takes its threads from OMP_NUM_THREADS (a
        # worker that runs no torch test, as in tests/test_parallel.py's sample, skips its 3 s)
    import torch

    torch.set_num_threads(threads)


def _session_fixtures(item) -> set[str]:
    """The session fixtures ``item`` uses that a folder's conftest defines (tests/slurm/...):
    the costly shared runs. The suite's root conftest's are cheap lookups; pytest's own and a
    module's are per worker anyway."""
    info = getattr(item, "_fixtureinfo", None)
    found = set()
    for name, defs in info.name2fixturedefs.items() if info else ():
        for fixture in defs:
            where = Path(fixture.func.__code__.co_filename).resolve()
            shared = where.name == "conftest.py" and where != ROOT_CONFTEST
            if fixture.scope == "session" and shared:
                found.add(f"{where}::{name}")
    return found


def groups(items) -> dict[str, str]:
    """Module path -> group name: a module alone, or joined with every module that shares a
    folder conftest's session fixture with it (union-find over the modules)."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for item in items:
        module = item.nodeid.split("::", 1)[0]
        root(module)
        for fixture in _session_fixtures(item):
            parent[root(module)] = root(fixture)
    members: dict[str, list[str]] = {}
    for key in list(parent):
        if not key.endswith(".py") or "::" in key:
            continue
        members.setdefault(root(key), []).append(key)
    return {m: min(ms) for ms in members.values() for m in ms}


def mark_groups(items) -> None:
    import pytest

    named = groups(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(named[item.nodeid.split("::", 1)[0]]))

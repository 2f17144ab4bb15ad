"""What this process may use of the machine it runs on: host RAM (the least of MemTotal, its
cgroups' memory limits and a Slurm job's request) and the CUDA devices' memory, as the
preflight (:mod:`chord.checks.preflight`), ``chord doctor`` and the Trainer read them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from chord.resources import gpus
from chord.resources.peak_memory import MiB


def gpu_bytes(device=None) -> int | None:
    """Total memory of the CUDA device (the current one by default), None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.device(device if device is not None else "cuda")
    return torch.cuda.get_device_properties(device).total_memory


def host_bytes(
    env: Mapping[str, str] | None = None,
    *,
    proc: Path = Path("/proc"),
    cgroup: Path = Path("/sys/fs/cgroup"),
) -> int | None:
    """Host RAM this process may use, in bytes: the least of the machine's RAM (MemTotal), the
    memory limits of the cgroups it runs in and a Slurm job's memory request; None when none of
    them is known.

    The cgroups are those ``proc/self/cgroup`` names, not the mount's root: a Slurm job's limit
    (its --mem) lies in the job's own cgroup, ``<cgroup>/<path>/memory.max`` under cgroup v2 (a
    line ``0::<path>``), ``<cgroup>/memory/<path>/memory.limit_in_bytes`` under v1 (a line
    ``N:memory:<path>``), and every cgroup from there up to the root limits the process ("max":
    no limit). The Slurm request is read from ``env`` (os.environ when None): SLURM_MEM_PER_NODE,
    else SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE or SLURM_MEM_PER_GPU x SLURM_GPUS_ON_NODE, in
    MB (0: the whole node). ``proc`` and ``cgroup`` are where procfs and the cgroup file systems
    are mounted."""
    env = os.environ if env is None else env
    limits = []
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for mount, path, name in _memory_cgroups(proc, cgroup):
        parts = [p for p in path.split("/") if p not in ("", ".", "..")]
        for depth in range(len(parts), -1, -1):  # the cgroup, then each parent up to the root
            limits += _cgroup_limit(mount.joinpath(*parts[:depth], name))
    limits += _slurm_limit(env)
    return min(limits) if limits else None


def _memory_cgroups(proc: Path, cgroup: Path) -> list[tuple[Path, str, str]]:
    """(mount point, cgroup path, limit file) of each memory cgroup of ``proc/self/cgroup``;
    without that file, the mounts' roots (a container's own cgroup, where it has one)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return [(cgroup, "", "memory.max"), (cgroup / "memory", "", "memory.limit_in_bytes")]
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":  # cgroup v2: the unified hierarchy
            found.append((cgroup, parts[2].strip(), "memory.max"))
        elif "memory" in parts[1].split(","):  # cgroup v1: the memory controller's hierarchy
            found.append((cgroup / "memory", parts[2].strip(), "memory.limit_in_bytes"))
    return found


def _cgroup_limit(path: Path) -> list[int]:
    """[the limit a cgroup's memory.max or memory.limit_in_bytes holds]; [] for none."""
    try:
        text = path.read_text().strip()
    except OSError:
        return []
    return [int(text)] if text.isdigit() else []  # "max": no limit


def _slurm_limit(env: Mapping[str, str]) -> list[int]:
    """[a Slurm job's memory request in bytes] from its environment; [] outside a job."""

    def number(key: str) -> int | None:
        try:
            return int(env[key])
        except (KeyError, ValueError):
            return None

    mb = number("SLURM_MEM_PER_NODE")
    for per, count in (
        ("SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE"),
        ("SLURM_MEM_PER_GPU", "SLURM_GPUS_ON_NODE"),
    ):
        if mb is None and number(per) is not None and number(count) is not None:
            mb = number(per) * number(count)
    return [mb * MiB] if mb else []  # Slurm's MB are MiB; 0 asks for the whole node


def torch_node() -> gpus.Node | None:
    """The node's GPUs as torch sees them (where nvidia-smi is not on PATH), None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    small = min(props, key=lambda p: p.total_memory)
    card = gpus.Card(small.name, small.total_memory / gpus.MiB, f"{small.major}.{small.minor}")
    return gpus.Node(len(props), card, "torch")

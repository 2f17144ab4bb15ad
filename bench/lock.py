"""The lock: the exact versions the tests run with and the main job installs, made by uv from
pyproject.toml's ranges, and the GPU machine's carried wheels pinned from it.

- ``requirements/test.txt``: the package, its ``test``, ``slurm``, ``tensorboard`` and ``docs``
  extras;
  the README's test command and .ci/run install it.
- ``requirements/main.txt``: the package alone, at test.txt's versions (resolved with test.txt
  as its constraints); the README's main-job command installs it.

Both are universal (``uv pip compile --universal``): one resolution for every Python and
platform pyproject.toml admits, a marker on the few packages whose version differs by Python,
so the same file serves CI's Python 3.11 and the GPU image's 3.12 (bench/gpu_wheels.txt reads
its pins at the device's markers). Every line is hashed (every file of that version, so any
platform's wheel checks), and the README installs with ``--require-hashes``; pip refuses hashes
in a constraints file (``-c``), so the project itself follows with ``--no-deps -e .``.
``--exclude-newer`` is the lock's date: refreshing on another day with the same date gives the
same file. uv, not pip-tools: pip-compile resolves for the interpreter that runs it, so a
3.12 device and a 3.10 user would need a lock each, and it has no upload-date cut-off.

torch is pinned apart (:data:`TORCH`): the README installs it first, alone (this machine's CPU
build, ``torch-2.13.0+cpu`` from a local folder, whose hashes no lock can know; a user's CUDA
build, whose runtime its own metadata pins exactly), and the lock then installs its pure-Python
requirements (sympy, networkx, ...) at the locked versions. So the lock resolves with torch at
that version and leaves out torch and the CUDA runtime PyPI's Linux torch brings: the packages
it reaches only through torch under a Linux-only marker (:func:`cuda_runtime`). (torch with
``--no-deps`` first does not do: pip's hash mode then refuses the requirements of the
installed torch, ``networkx>=2.5.1``, as unpinned.)

    python bench/lock.py compile [--date YYYY-MM-DD]   # both locks, and gpu_wheels.txt's pins
    python bench/lock.py refresh [--date YYYY-MM-DD]   # that, a fresh .venv from the lock, the
                                                       # README's tests, and .whl/ refilled
    python bench/lock.py check                         # the locks meet pyproject.toml (exit 1)
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
TEST_LOCK = ROOT / "requirements" / "test.txt"
MAIN_LOCK = ROOT / "requirements" / "main.txt"
WHEELS = ROOT / "bench" / "gpu_wheels.txt"
#: the torch the README's commands install before the lock (the CPU build on this machine's disk)
TORCH = "2.13.0"
#: the extras test.txt holds besides the package's own requirements
TEST_EXTRAS = ("test", "slurm", "tensorboard", "docs")
COMPILE_COMMAND = "python bench/lock.py compile"
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*==[^\s\\]+(?:\s*;[^\\]*)?)\s*\\?$")
_VIA = re.compile(r"^\s+#\s+(?:via\s+)?(?!via\s*$)([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Entry:
    """One locked distribution: ``name==version ; marker`` with its hashes and who needs it."""

    name: str
    version: str
    marker: Marker | None
    hashes: list[str] = field(default_factory=list)
    via: set[str] = field(default_factory=set)

    def applies(self, env: dict) -> bool:
        return self.marker is None or self.marker.evaluate(env)


def read(path: Path) -> list[Entry]:
    """A uv (or pip-tools) requirements file with hashes and ``# via`` annotations. ValueError
    names the file and line of anything else: a range, a URL, an option."""
    entries: list[Entry] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or line.startswith("#"):
            continue
        if m := _ENTRY.match(line):
            req = Requirement(m[1])
            (spec,) = req.specifier
            entries.append(Entry(canonical(req.name), spec.version, req.marker))
        elif stripped.startswith("--hash=") and entries:
            entries[-1].hashes.append(stripped.removeprefix("--hash=").rstrip(" \\"))
        elif (m := _VIA.match(line)) and entries:
            entries[-1].via.add(canonical(m[1]))
        elif stripped.startswith("#") and entries:
            continue  # "# via" followed by names on the next lines
        else:
            what = "expected NAME==VERSION, a hash, a note"
            raise ValueError(f"{path}:{number}: {stripped!r}: {what}")
    return entries


def pins(path: Path, env: dict | None = None) -> dict[str, str]:
    """``{name: version}`` of the entries that hold at ``env`` (default: this interpreter)."""
    env = default_environment() | {"extra": ""} if env is None else env
    out: dict[str, str] = {}
    for e in read(path):
        if e.applies(env):
            if e.name in out and out[e.name] != e.version:
                raise ValueError(f"{path}: {e.name} at {out[e.name]} and {e.version} for one place")
            out[e.name] = e.version
    return out


def cuda_runtime(entries: list[Entry]) -> set[str]:
    """torch and what the lock holds only for it under a Linux-only marker (PyPI's Linux torch
    is a CUDA build: triton, nvidia-*, cuda-*), closed over what those alone need. The CPU
    build's own requirements (sympy, networkx, filelock, ...) carry no such marker and stay."""
    elsewhere = [
        {**default_environment(), "extra": "", "sys_platform": p, "platform_system": s}
        for p, s in (("darwin", "Darwin"), ("win32", "Windows"))
    ]
    linux = {e.name for e in entries if e.marker and not any(map(e.marker.evaluate, elsewhere))}
    via: dict[str, set[str]] = {}
    for e in entries:
        via.setdefault(e.name, set()).update(e.via)
    out = {"torch"}
    grew = True
    while grew:
        grew = False
        for name, needs in via.items():
            if name not in out and name in linux and needs and needs <= out:
                out.add(name)
                grew = True
    return out


def requirements(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """pyproject.toml's requirements, with those of ``extras`` and of its build system (the
    README builds the package without isolation, with the lock's setuptools)."""
    pyproject = tomllib.loads(PYPROJECT.read_text())
    project = pyproject["project"]
    lines = list(project["dependencies"]) + list(pyproject["build-system"]["requires"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def problems(lock: Path, extras: tuple[str, ...], envs: dict[str, dict]) -> list[str]:
    """Where ``lock`` does not meet pyproject.toml's requirements (with ``extras``) at each of
    ``envs``: a requirement missing, or locked at a version its range refuses; a line unhashed;
    torch or its CUDA runtime locked (the README installs them apart)."""
    entries = read(lock)
    out = [f"{lock.name}: {e.name}=={e.version} has no hash" for e in entries if not e.hashes]
    if any(e.name == "torch" for e in entries):
        out.append(f"{lock.name}: torch is locked (the README installs it apart, --no-deps)")
    for where, env in envs.items():
        locked = pins(lock, env)
        for req in requirements(extras):
            name = canonical(req.name)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            version = TORCH if name == "torch" else locked.get(name)
            if version is None:
                out.append(f"{lock.name}: {req} is not locked for {where}")
            elif not req.specifier.contains(version, prereleases=True):
                out.append(f"{lock.name}: {name}=={version} for {where}, pyproject.toml asks {req}")
    return out


def _uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    probe = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "uv"]
    sys.exit("bench/lock.py: uv not found (pip install uv): it makes the lock")


def _compile(out: Path, date: str, extras: tuple[str, ...], *extra_args: str) -> None:
    """uv's lock of pyproject.toml (with ``extras``) and its build requirements, so that the
    README's ``pip install --no-build-isolation --no-deps -e .`` builds with locked tools."""
    build = "\n".join(tomllib.loads(PYPROJECT.read_text())["build-system"]["requires"])
    args = [*_uv(), "pip", "compile", str(PYPROJECT.relative_to(ROOT)), "-", "--universal"]
    args += ["--generate-hashes", "--exclude-newer", date, "--quiet", "-o", str(out)]
    args += [f"--extra={e}" for e in extras]
    args += ["--custom-compile-command", COMPILE_COMMAND, *extra_args]
    subprocess.run(args, cwd=ROOT, check=True, input=build, text=True)


def compile_locks(date: str) -> None:
    """Both locks as of ``date``, then gpu_wheels.txt's pins from test.txt."""
    with tempfile.TemporaryDirectory() as tmp:
        torch = Path(tmp) / "torch.txt"
        torch.write_text(f"torch=={TORCH}\n")
        full = Path(tmp) / "full.txt"
        _compile(full, date, TEST_EXTRAS, "-c", str(torch))
        leave_out = [f"--no-emit-package={n}" for n in sorted(cuda_runtime(read(full)))]
        TEST_LOCK.parent.mkdir(exist_ok=True)
        _compile(TEST_LOCK, date, TEST_EXTRAS, "-c", str(torch), *leave_out)
        _compile(MAIN_LOCK, date, (), "-c", str(torch), "-c", str(TEST_LOCK), *leave_out)
    for lock in (TEST_LOCK, MAIN_LOCK):
        _stamp(lock, date)
    pin_wheels()


def _stamp(lock: Path, date: str) -> None:
    """The lock's date and torch's pin in its header, after uv's lines."""
    lines = lock.read_text().splitlines(keepends=True)
    header = [
        f"# Locked on {date}: nothing uploaded since (uv --exclude-newer {date}).\n",
        f"# torch=={TORCH} is installed before this file (the README's commands); it and\n",
        "# the CUDA runtime of PyPI's Linux torch are left out (bench/lock.py).\n",
    ]
    lock.write_text("".join(lines[:2] + header + lines[2:]))


def lock_date(lock: Path = TEST_LOCK) -> str:
    m = re.search(r"^# Locked on (\d{4}-\d{2}-\d{2})", lock.read_text(), re.M)
    if m is None:
        raise ValueError(f"{lock}: no '# Locked on YYYY-MM-DD' line")
    return m[1]


def wheel_pins(lock: Path = TEST_LOCK, wheels: Path = WHEELS) -> dict[str, str]:
    """The carried wheels' versions as the lock has them at the GPU device's markers; ValueError
    names a carried wheel the lock does not hold there."""
    from bench import gpu_imports

    locked = pins(lock, gpu_imports.DEVICE_MARKERS)
    carried = gpu_imports.carried_wheels(wheels)
    absent = sorted(set(carried) - set(locked))
    if absent:
        raise ValueError(f"{wheels.name} carries {absent}, which {lock.name} does not hold")
    return {name: locked[name] for name in carried}


def pin_wheels(lock: Path = TEST_LOCK, wheels: Path = WHEELS) -> dict[str, tuple[str, str]]:
    """Rewrite gpu_wheels.txt's ``NAME==VERSION`` lines at the lock's versions, comments kept;
    returns what changed, ``{name: (old, new)}``."""
    from bench import gpu_imports

    new = wheel_pins(lock, wheels)
    changed = {}
    lines = []
    for raw in wheels.read_text().splitlines(keepends=True):
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", raw)
        if m and (name := gpu_imports.canonical(m[1])) in new and new[name] != m[2]:
            changed[name] = (m[2], new[name])
            raw = f"{m[1]}=={new[name]}{raw[m.end() :]}"
        lines.append(raw)
    wheels.write_text("".join(lines))
    return changed


def environments() -> dict[str, dict]:
    """Where the locks must hold: this interpreter (CI's) and the GPU device."""
    from bench import gpu_imports

    here = default_environment() | {"extra": ""}
    return {"this Python": here, "the GPU device": gpu_imports.DEVICE_MARKERS}


def check() -> list[str]:
    envs = environments()
    return problems(TEST_LOCK, TEST_EXTRAS, envs) + problems(MAIN_LOCK, (), envs)


def readme_command(heading: str) -> str:
    """The README's command in the first ```bash block after the line ``heading``."""
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"^{re.escape(heading)}\n.*?```bash\n(.*?)\n```", text, re.M | re.S)
    if m is None:
        raise ValueError(f"README.md: no ```bash block after {heading!r}")
    return m[1]


def refresh(date: str) -> None:
    """compile_locks, then the README's test command in a fresh .venv (the lock's install and
    the whole suite), then .whl/ refilled from the new pins."""
    compile_locks(date)
    shutil.rmtree(ROOT / ".venv", ignore_errors=True)
    subprocess.run(["bash", "-c", readme_command("Run the tests:")], cwd=ROOT, check=True)
    subprocess.run(["bash", "bench/gpu_device.sh", "--fetch-wheels"], cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench/lock.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["compile", "refresh", "check"])
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    parser.add_argument("--date", default=today, help="no release after it (default: today)")
    args = parser.parse_args(argv)
    if args.action == "check":
        found = check()
        print("\n".join(found) or f"the locks of {lock_date()} meet pyproject.toml")
        sys.exit(1 if found else 0)
    dt.date.fromisoformat(args.date)  # a bad --date fails here, naming it
    (refresh if args.action == "refresh" else compile_locks)(args.date)
    if args.action == "compile":
        names = ", ".join(str(p.relative_to(ROOT)) for p in (TEST_LOCK, MAIN_LOCK))
        print(f"{names}: locked on {args.date}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()

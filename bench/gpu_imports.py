"""The GPU device machine's Python packages, and a guard that fails here an import that would
fail there.

The device machine has no network: what the GPU check and the training may import there is the
standard library, chord (and bench), the packages on its image (gpu_image_packages.txt, vendored
from the device notes) and the wheels carried to it in .whl/ (gpu_wheels.txt, pinned).
:func:`install` puts :class:`DeviceImportGuard` first on ``sys.meta_path``: importing any other
third-party top-level module raises ModuleNotFoundError naming it, where it comes from here, who
imported it, and that it is neither on the image nor carried; ``importlib.util.find_spec``
(the availability probe of transformers and diffusers) answers None for it, as it does there.

Which distribution a module comes from is ``importlib.metadata.packages_distributions()`` of
this environment, so distribution names map to import names as installed (pillow -> PIL, pyyaml
-> yaml, scikit-learn -> sklearn, opencv-python-headless -> cv2). A module imported by a package
of the image (not by chord, bench, a carried wheel or the script) is let through: the image has
its own versions of those packages, whose own needs it meets (huggingface_hub here imports
httpx2, the image's version httpx; setuptools imports its vendored jaraco), and so are the
imports of a module let through so, and the image's probes (transformers here requires
``kernels``, the image's version does not).

    python bench/gpu_imports.py [--import MODULE]... SCRIPT [ARGS...]   # SCRIPT under the guard
    python bench/gpu_imports.py [--import MODULE]... -m MODULE [ARGS...]
    python bench/gpu_imports.py --check-wheels .whl    # .whl/ holds exactly gpu_wheels.txt

``--import`` imports a module first (one that the CPU run never reaches: mmgp, for instance).
tests/unit/bench/test_gpu_imports.py runs the check's --tiny run and a training iteration so.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import importlib.util
import re
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMAGE_PACKAGES = HERE / "gpu_image_packages.txt"
WHEELS = HERE / "gpu_wheels.txt"
#: distributions whose code is checked like the script's: chord itself (always allowed)
OURS = {"chord-pipeline"}
#: requirements of a carried wheel that are neither on the image nor carried, and why not
NOT_CARRIED = {
    "importlib-metadata": "diffusers imports it only on Python < 3.8 (the image has 3.12)",
}
#: the device's interpreter and platform, for the markers of the wheels' requirements
DEVICE_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "extra": "",
}
_LINE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+))?")


def canonical(name: str) -> str:
    """A distribution's normalised name (PEP 503): ``PyYAML`` -> ``pyyaml``, ``typing_extensions``
    -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path, *, pinned: bool = False) -> dict[str, str | None]:
    """``{canonical name: version or None}`` of a list of ``name`` or ``name==version`` lines
    (``#`` comments, blank lines skipped). ValueError names the file and line of a bad line, a
    duplicate, or (``pinned``) a name without its version."""
    out: dict[str, str | None] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.fullmatch(line)
        where = f"{path}:{number}: {raw.strip()!r}"
        if m is None:
            raise ValueError(f"{where}: expected NAME or NAME==VERSION")
        name, version = canonical(m[1]), m[2]
        if pinned and version is None:
            raise ValueError(f"{where}: expected NAME==VERSION (a wheel is carried pinned)")
        if name in out:
            raise ValueError(f"{where}: {name} is listed twice")
        out[name] = version
    return out


def image_packages(path: Path = IMAGE_PACKAGES) -> dict[str, str | None]:
    return read_list(path)


def carried_wheels(path: Path = WHEELS) -> dict[str, str]:
    return read_list(path, pinned=True)  # type: ignore[return-value]


class DeviceImportGuard(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that refuses the top-level modules of distributions neither on
    the image (``image``) nor carried (``wheels``), unless a package of the image imports them
    (see the module's docstring). ``modules`` maps a top-level module to the distributions that
    provide it (default: ``importlib.metadata.packages_distributions()``)."""

    def __init__(self, image, wheels, modules: dict[str, list[str]] | None = None):
        self.image = {canonical(n) for n in image}
        self.wheels = {canonical(n) for n in wheels}
        self.allowed = self.image | self.wheels | OURS
        if modules is None:
            modules = importlib.metadata.packages_distributions()
        self.modules = {top: [canonical(d) for d in dists] for top, dists in modules.items()}
        #: blocked modules let through because the image's side imported them
        self.image_side: set[str] = set()

    def blocked(self, name: str) -> list[str] | None:
        """The distributions that provide top-level module ``name`` here when none of them is
        on the image or carried; None when it may be imported (the standard library, chord,
        modules of no distribution: the script's own, bench's)."""
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names:
            return None
        dists = self.modules.get(top)
        if not dists or self.allowed.intersection(dists):
            return None
        return sorted(set(dists))

    def image_owned(self, module: str) -> bool:
        """Whether ``module`` (a ``__name__``) belongs to a package of the image that is not also
        carried, or to a module such a package imported: their imports are the image's
        business."""
        top = module.partition(".")[0]
        dists = self.modules.get(top, [])
        own = any(d in self.image and d not in self.wheels for d in dists)
        return own or top in self.image_side

    @staticmethod
    def importer(depth: int = 2) -> str:
        """The ``__name__`` of the code whose import reached the guard: the first frame, from
        ``depth`` frames above this one outwards, outside the standard library (importlib's
        machinery, ``importlib.import_module``) and this module (the guarded probe);
        ``"?"`` when there is none."""
        frame = sys._getframe(depth)
        while frame is not None:
            name = frame.f_globals.get("__name__") or ""
            ours = frame.f_globals is globals()
            if not ours and name.partition(".")[0] not in sys.stdlib_module_names:
                return name
            frame = frame.f_back
        return "?"

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or "." in fullname:
            return None  # a submodule: its top-level package was let through
        dists = self.blocked(fullname)
        if dists is None:
            return None
        importer = self.importer()
        if self.image_owned(importer):
            self.image_side.add(fullname)
            return None
        raise ModuleNotFoundError(
            f"{fullname} (from {', '.join(dists)}, imported by {importer}) is neither on the GPU "
            f"image (bench/gpu_image_packages.txt) nor carried (bench/gpu_wheels.txt): on the "
            f"device machine this import fails. Carry its wheel (NAME==VERSION in "
            f"bench/gpu_wheels.txt) or import it only in the functions that need it",
            name=fullname,
        )

    def probe(self, find_spec):
        """``importlib.util.find_spec`` that answers None for a blocked top-level module, unless
        the image's side asks (transformers here requires ``kernels``; the image's does not)."""

        def guarded_find_spec(name, package=None):
            top = not name.startswith(".") and "." not in name
            if top and self.blocked(name) is not None and not self.image_owned(self.importer()):
                return None
            return find_spec(name, package)

        guarded_find_spec.original = find_spec
        return guarded_find_spec


def install(image: Path = IMAGE_PACKAGES, wheels: Path = WHEELS) -> DeviceImportGuard:
    """Put the guard of ``image`` and ``wheels`` first on ``sys.meta_path`` and behind
    ``importlib.util.find_spec``; returns it (:func:`uninstall` takes it out)."""
    guard = DeviceImportGuard(image_packages(image), carried_wheels(wheels))
    sys.meta_path.insert(0, guard)
    importlib.util.find_spec = guard.probe(importlib.util.find_spec)
    return guard


def uninstall(guard: DeviceImportGuard) -> None:
    """Undo :func:`install` (the guard installed last first)."""
    sys.meta_path.remove(guard)
    importlib.util.find_spec = importlib.util.find_spec.original


def wheel_folder_problems(folder: Path, wheels: Path = WHEELS) -> list[str]:
    """What keeps the wheels in ``folder`` (.whl/) from being exactly ``wheels``' list: a listed
    one missing (fill it: bench/gpu_device.sh --fetch-wheels), one not listed (two versions of
    a package stop pip's install there), a file that is not a wheel."""
    want = carried_wheels(wheels)
    have: dict[str, str] = {}
    problems = []
    for f in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        parts = f.name.split("-")
        if f.suffix != ".whl" or len(parts) < 5:
            problems.append(f"{f.name}: not a wheel")
            continue
        name, version = canonical(parts[0]), parts[1]
        if want.get(name) != version:
            problems.append(f"{f.name}: not in {wheels.name} (it has {name}=={want.get(name)})")
        have[name] = version
    for name, version in want.items():
        if have.get(name) != version:
            problems.append(f"{name}=={version}: no wheel in {folder}")
    return problems


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = (
        "usage: gpu_imports.py [--import MODULE]... (SCRIPT | -m MODULE) [ARGS...]\n"
        "       gpu_imports.py --check-wheels FOLDER"
    )
    if argv[:1] == ["--check-wheels"] and len(argv) == 2:
        folder = Path(argv[1])
        problems = wheel_folder_problems(folder)
        if problems:
            sys.exit(
                f"{folder}: not the wheels of {WHEELS.name}:\n  "
                + "\n  ".join(problems)
                + "\nfill it with: bash bench/gpu_device.sh --fetch-wheels"
            )
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(
            f"{folder}: the {len(carried_wheels())} wheels of {WHEELS.name}, {size / 2**20:.1f} MiB"
        )
        return
    imports = []
    while argv[:1] == ["--import"] and len(argv) > 1:
        imports.append(argv[1])
        argv = argv[2:]
    if not argv or argv[0].startswith("-") and argv[0] != "-m" or argv == ["-m"]:
        sys.exit(usage)
    install()
    for name in imports:
        importlib.import_module(name)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()

"""The ``chord`` source files a workflow stage's result depends on (issue 15).

A stage's sources are its module (``chord/stages/<stage>.py``) and every package module it
imports, transitively, read from the source with :mod:`ast`; nothing is imported, so the DAG
build that calls this stays fast and torch-free. Imports inside functions count (a lazy import
is still a dependency), as do the ``__init__.py`` of every package on an import's path and the
data files a module opens beside itself (``config/schema.py``'s ``schemas/``). The workflow hashes
each stage's files (:func:`digest`) into that stage's one code input (``rules/code.smk``).
Every Snakemake start (a cluster job's too) needs the lists: :func:`cached_sources_by_stage`
keeps them in a file under the digest of the whole package tree.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from chord.core import atomic_files

PACKAGE = "chord"
ROOT = Path(__file__).resolve().parents[1]  # the package folder

# The workflow's stages; each is the module chord.stages.<stage> (train: train_coarse and
# train_fine; demo: the demo_<name> rules).
STAGES = (
    "demo",
    "ingest",
    "gaussians",
    "voxelize",
    "reference",
    "condition",
    "train",
    "export",
    "viewer",
    "evaluate",
    "sweep",
    "aggregate",
    "preview",
    "preview_strip",
)

# Result-neutral modules: editing one re-runs nothing, and what only they import is not
# followed. Keep it short: a module missing here is a dependency.
EXEMPT = {
    "chord.core.atomic_files": "atomic writes, JSON layout: how an output lands, not what",
    "chord.plan.results_layout": "output names: a renamed output is a new target the DAG sees",
    "chord.resources.peak_memory": "the peak-memory model: it picks a tier; size is a param",
    "chord.resources.job_memory": "memory estimates of the jobs around a training: resources",
    "chord.resources.gpus": "which GPU a job takes and how many run at once, not what they compute",
    "chord.resources.cuda_settings": "allocator settings, cache emptying: memory and speed",
    "chord.checks.preflight": "preflight checks: a training passes them or stops",
    "chord.checks.capacity": "memory and disk checks, the run's sizes: a training passes or stops",
    "chord.resources.machine": "the host RAM and GPU memory this process may use",
    "chord.training.device_report": "a training's device and memory log lines, not its result",
    "chord.core.errors": "the bad-input exception type: how a failure is reported, not a result",
    "chord.plan.code_sources": "this module: a change that matters changes the files it lists",
}


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of package module ``name`` (``chord.a.b``: ``a/b/__init__.py`` or ``a/b.py``
    under the package folder ``root``), or None when ``name`` is no module of the package
    (e.g. a name defined in one)."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    folder = root.joinpath(*parts[1:])
    if (folder / "__init__.py").is_file():
        return folder / "__init__.py"
    module = folder.with_name(f"{folder.name}.py")
    return module if len(parts) > 1 and module.is_file() else None


def _statements(body: list[ast.stmt]):
    """Every statement in ``body`` and in the blocks nested in it (functions, classes, if, try,
    with, loops, match): the only places an import can be."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, field, None) or [])


def _read(path: Path, name: str, root: Path) -> tuple[set[str], set[Path]]:
    """What module ``name`` (at ``path``) depends on: the dotted names it imports anywhere
    (``import a.b``; ``from a import b`` as ``a`` and ``a.b``, where ``b`` may be a submodule
    or a name, which finds no file; relative imports resolved against its package), and the
    non-Python package files it names by a string relative to its folder when it locates
    itself by ``__file__`` (that file, or every file of that folder)."""
    source = path.read_bytes()
    tree = ast.parse(source, filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imports = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            imports.add(base)
            imports.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    data = set()
    nodes = list(ast.walk(tree)) if b"__file__" in source else []  # the walk is slow
    if not any(isinstance(n, ast.Name) and n.id == "__file__" for n in nodes):
        return imports, data
    for node in nodes:
        text = node.value if isinstance(node, ast.Constant) else None
        if not isinstance(text, str) or not text.strip(". /") or len(text) > 200:
            continue
        if any(c in text for c in "\0\n*?{}"):
            continue
        target = (path.parent / text).resolve()
        if target == root or not target.is_relative_to(root):
            continue
        files = sorted(target.rglob("*")) if target.is_dir() else [target]
        data.update(
            f
            for f in files
            if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in f.parts
        )
    return imports, data


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``: importing a module runs its packages first."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def closure(
    modules: Iterable[str],
    *,
    root: Path = ROOT,
    exempt: Iterable[str] = EXEMPT,
    parsed: dict | None = None,
) -> set[Path]:
    """The files of ``modules`` and of every package module they import, transitively (the
    ``__init__.py`` of each package on the way included), with the data files they read;
    ``exempt`` modules are left out and not followed. ``parsed`` caches what each file
    imports, for calls on the same tree."""
    exempt = set(exempt)
    parsed = {} if parsed is None else parsed  # module -> (imports, data files)
    files: set[Path] = set()
    seen: set[str] = set()
    todo = [m for name in modules for m in _with_parents(name)]
    while todo:
        module = todo.pop()
        if module in seen or module in exempt:
            continue
        seen.add(module)
        path = module_file(module, root)
        if path is None:
            continue  # outside the package, or a name imported from a module
        if module not in parsed:
            parsed[module] = _read(path, module, root)
        imports, data = parsed[module]
        files.add(path)
        files.update(data)
        ours = (n for n in imports if n == PACKAGE or n.startswith(f"{PACKAGE}."))
        todo.extend(m for name in ours for m in _with_parents(name))
    return files


def sources_by_stage(
    stages: Iterable[str] = STAGES, *, root: Path = ROOT, exempt: Iterable[str] = EXEMPT
) -> dict[str, list[Path]]:
    """:func:`sources` of each of ``stages`` (the package at ``root``), parsing each file
    once."""
    parsed: dict = {}
    result = {}
    for stage in stages:
        if stage not in STAGES:
            raise ValueError(f"stage: {stage!r} is not one of {STAGES}")
        module = f"{PACKAGE}.stages.{stage}"
        found = closure([module], root=root, exempt=exempt, parsed=parsed)
        result[stage] = sorted(found)
    return result


def tree_digest(root: Path = ROOT) -> str:
    """sha256 of the name and content of every file under the package folder ``root``
    (bytecode aside): everything :func:`closure` can read there."""
    files = (p for p in root.rglob("*") if "__pycache__" not in p.parts and p.is_file())
    return digest(files, root=root)


def cached_sources_by_stage(
    cache: Path, *, root: Path = ROOT, exempt: Iterable[str] = EXEMPT
) -> dict[str, list[Path]]:
    """:func:`sources_by_stage` of every stage, read from the JSON file ``cache`` when it was
    written for the same package tree (its :func:`tree_digest`), the same ``exempt`` modules
    and this module's own code; else found and written there. Parsing the package's modules
    takes a few tenths of a second; reading the tree to check, a few milliseconds."""
    root = Path(root).resolve()
    key = {
        "root": str(root),
        "tree": tree_digest(root),
        "exempt": sorted(exempt),
        "finder": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }
    try:
        kept = json.loads(Path(cache).read_text())
        if kept["key"] == key:
            return {stage: [Path(p) for p in kept["stages"][stage]] for stage in STAGES}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, another package's or damaged: found again
    found = sources_by_stage(root=root, exempt=exempt)
    stages = {stage: [str(p) for p in files] for stage, files in found.items()}
    try:
        atomic_files.write_json(cache, {"key": key, "stages": stages})
    except OSError:
        pass  # a folder it cannot write: found again next time
    return found


def sources(stage: str) -> list[Path]:
    """The package files ``stage``'s result depends on, sorted: ``chord/stages/<stage>.py``,
    the modules it imports (at the top or in a function) and theirs, the ``__init__.py`` of
    each package on the way and the data files they read (``schemas/*.yaml``); not the
    :data:`EXEMPT` modules, nor what only they import."""
    return sources_by_stage([stage])[stage]


def digest(files: Iterable[Path | str], *, root: Path = ROOT) -> str:
    """sha256 of ``files``' names (relative to the folder holding the package folder ``root``,
    so the same code anywhere gives the same digest) and contents."""
    h = hashlib.sha256()
    for path in sorted(Path(f).resolve() for f in files):
        data = path.read_bytes()
        h.update(f"{path.relative_to(root.resolve().parent).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()

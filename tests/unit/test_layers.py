"""README's "The package on one screen" is the package: every module is in exactly one layer of
its table, and a module imports only from its own layer or the ones below it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "chord"


def readme_layers() -> list[tuple[str, list[str]]]:
    """(layer, module entries) in the table's order, bottom layer first."""
    text = (REPO / "README.md").read_text()
    section = text.split("### The package on one screen", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def entry_files(entry: str) -> list[Path]:
    """The files a table entry names: `errors`, `motion/scripted`, `render/` (the package),
    `stages/<rule>` (every module of the package)."""
    if entry.endswith("/") or entry.endswith("/<rule>"):
        return sorted((PACKAGE / entry.split("/")[0]).glob("*.py"))
    return [PACKAGE / f"{entry}.py"]


def module_layers() -> dict[Path, int]:
    """Each module's layer; a named module (`motion/scripted`) is not also in its package's."""
    named, packages = {}, {}
    for i, (_, entries) in enumerate(readme_layers()):
        for entry in entries:
            target = packages if entry.endswith(("/", "/<rule>")) else named
            for f in entry_files(entry):
                assert f.is_file(), f"README names {entry}, but {f} does not exist"
                target.setdefault(f, []).append(i)
    twice = {f: i for f, i in named.items() if len(i) > 1}
    assert not twice, f"modules in more than one layer: {twice}"
    return {**{f: i[0] for f, i in packages.items()}, **{f: i[0] for f, i in named.items()}}


def imported_files(path: Path) -> set[Path]:
    """The package modules a module imports anywhere in it (module or function level)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            parts = name.split(".")
            if parts[0] != "chord" or len(parts) == 1:
                continue
            base = PACKAGE.joinpath(*parts[1:])
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.is_file():
                    found.add(f)
    return found


def test_every_module_is_in_one_layer_of_the_readme():
    layers = module_layers()
    modules = {
        f
        for f in PACKAGE.rglob("*.py")
        if f != PACKAGE / "__init__.py" and "node_modules" not in f.parts
    }
    missing = sorted(str(f.relative_to(PACKAGE)) for f in modules - set(layers))
    assert not missing, f"README's package table does not name: {missing}"


def test_no_module_imports_from_a_layer_above_its_own():
    layers, names = module_layers(), [name for name, _ in readme_layers()]
    upward = []
    for module, layer in sorted(layers.items()):
        for dep in sorted(imported_files(module)):
            if dep in layers and layers[dep] > layer:
                upward.append(
                    f"{module.relative_to(PACKAGE)} ({names[layer]}) imports "
                    f"{dep.relative_to(PACKAGE)} ({names[layers[dep]]})"
                )
    assert not upward, "\n".join(upward)

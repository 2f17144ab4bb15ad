"""The package as a house of folders (issue 35): every module sits in one folder of the layers
declared in ``chord/__init__.py``, imports (at the top or in a function) only from its own
folder or the ones before it, and no modules import each other in a circle; package faces hold
no code; no module is over 500 lines; docs/development.md's table and docs/DESIGN.md show the
declared layers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "chord"
FACE = PACKAGE / "__init__.py"
MAX_LINES = 500


def declared() -> list[str]:
    """The folders in their declared order, bottom first (``chord/__init__.py``'s list)."""
    return re.findall(r"^\d+\. ``(\w+)``", ast.get_docstring(ast.parse(FACE.read_text())), re.M)


def modules() -> list[Path]:
    return sorted(f for f in PACKAGE.rglob("*.py") if "node_modules" not in f.parts)


def folder(module: Path) -> str | None:
    """The top folder of a module under chord/, None for chord/__init__.py."""
    parts = module.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def imports(module: Path) -> set[Path]:
    """The package files ``module`` imports anywhere in it: ``import chord.a.b``, ``from
    chord.a import b`` (``b`` a module or a name of ``chord/a``), relative imports resolved."""
    tree = ast.parse(module.read_text())
    package = module.relative_to(REPO).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [base])])
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        for name in names:
            parts = name.split(".")
            if parts[0] != "chord":
                continue
            base = REPO.joinpath(*parts)
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.is_file() and f != module:
                    found.add(f)
    return found


def graph() -> dict[Path, set[Path]]:
    return {m: imports(m) for m in modules()}


def circles(edges: dict[Path, set[Path]]) -> list[list[Path]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(root):
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def name(f: Path) -> str:
    return f.relative_to(PACKAGE).as_posix()


def test_every_module_is_in_one_declared_folder():
    layers = declared()
    assert len(layers) == len(set(layers)) > 10, layers
    outside = [name(m) for m in modules() if m != FACE and folder(m) not in layers]
    assert not outside, f"modules outside the folders declared in chord/__init__.py: {outside}"
    empty = [f for f in layers if not (PACKAGE / f / "__init__.py").is_file()]
    assert not empty, f"declared folders that are no package: {empty}"


def test_no_module_imports_from_a_folder_after_its_own():
    order = {f: i for i, f in enumerate(declared())}
    upward = [
        f"{name(m)} imports {name(d)}"
        for m, deps in graph().items()
        for d in sorted(deps)
        if folder(m) in order and folder(d) in order and order[folder(d)] > order[folder(m)]
    ]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(map(name, c)) for c in found)


def test_the_circle_finder_finds_a_circle():
    a, b, c = Path("a"), Path("b"), Path("c")
    assert circles({a: {b}, b: {c}, c: {a}}) == [[a, b, c]]
    assert circles({a: {b}, b: {c}, c: set()}) == []


def test_package_faces_hold_no_code():
    """A face's imports would join every stage digest that passes through it
    (chord/plan/code_sources.py follows package faces)."""
    for face in PACKAGE.rglob("__init__.py"):
        body = ast.parse(face.read_text()).body
        code = body[1:] if body and isinstance(body[0], ast.Expr) else body
        if face == FACE:  # the version beside the layers' declaration
            code = [
                s for s in code if not (isinstance(s, ast.Assign) and "__version__" in ast.dump(s))
            ]
        assert not code, f"{name(face)} holds code: keep a package face a docstring"


def test_no_module_is_over_500_lines():
    long = {name(m): n for m in modules() if (n := len(m.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_the_readme_and_the_design_show_the_declared_layers():
    layers = declared()
    text = (REPO / "docs" / "development.md").read_text()
    section = text.split("## The package on one screen", 1)[1].split("\n#", 1)[0]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    assert [r[0].strip("`/") for r in rows] == layers
    for row in rows:
        listed = set(re.findall(r"`([^`]+)`", row[1])) - {"<rule>"}
        files = {f.stem for f in (PACKAGE / row[0].strip("`/")).glob("*.py")} - {"__init__"}
        if row[0] == "`stages/`":
            files &= listed  # one module per rule: the table names the shared one
        assert listed == files, (
            f"docs/development.md's row {row[0]}: lists {sorted(listed)}, holds {sorted(files)}"
        )
    design = (REPO / "docs/DESIGN.md").read_text().split("## The package's layers", 1)[1]
    arrows = re.search(r"^(\w+(?: →\s+\w+)+)", design.replace("→\n", "→ "), re.M)
    assert arrows and arrows[1].split(" → ") == layers

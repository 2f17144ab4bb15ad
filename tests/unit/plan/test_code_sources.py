"""Tests for chord.plan.code_sources: the package files each stage's result depends on, from
imports."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chord.plan import code_sources as cs
from chord.plan.code_sources import EXEMPT, STAGES, digest, sources, sources_by_stage
from tests.conftest import REPO


def module_name(path: Path) -> str:
    """chord/a/b.py -> chord.a.b; chord/a/__init__.py -> chord.a."""
    rel = path.relative_to(cs.ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules(files) -> set[str]:
    return {module_name(f) for f in files if f.suffix == ".py"}


RUNTIME_IMPORTS = """
import importlib, json, sys

loaded = {}
for name in sys.argv[1:]:
    for m in [m for m in sys.modules if m == "chord" or m.startswith("chord.")]:
        del sys.modules[m]  # each import runs the package afresh; torch & co. stay loaded
    importlib.import_module(name)
    loaded[name] = [m for m in sys.modules if m == "chord" or m.startswith("chord.")]
print(json.dumps(loaded))
"""


def runtime_imports(names: list[str]) -> dict[str, set[str]]:
    """Module -> the chord modules in sys.modules after importing it (in one interpreter,
    with no chord module loaded before each import)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", RUNTIME_IMPORTS, *names],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: set(mods) for name, mods in json.loads(proc.stdout).items()}


def defined_in(names: list[str]) -> dict[str, Path]:
    """Name -> the package file whose top level defines that function or class (found by ast,
    so the test follows a function wherever a refactoring moves it)."""
    found: dict[str, list[Path]] = {name: [] for name in names}
    for path in sorted(cs.ROOT.rglob("*.py")):
        for node in ast.parse(path.read_bytes()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in found:
                found[node.name].append(path)
    assert all(len(paths) == 1 for paths in found.values()), found
    return {name: paths[0] for name, paths in found.items()}


@pytest.fixture(scope="module")
def by_stage() -> dict[str, list[Path]]:
    return sources_by_stage()


@pytest.fixture(scope="module")
def loaded() -> dict[str, set[str]]:
    """Stage -> the chord modules importing its module loads."""
    found = runtime_imports([f"chord.stages.{stage}" for stage in STAGES])
    return {stage: found[f"chord.stages.{stage}"] for stage in STAGES}


@pytest.mark.parametrize("stage", STAGES)
def test_sources_hold_the_runtime_import_closure(stage, by_stage, loaded):
    """Importing the stage module loads only modules its sources list (or exempt ones); the
    AST closure without exemptions holds every one."""
    assert f"chord.stages.{stage}" in loaded[stage]
    assert loaded[stage] - set(EXEMPT) <= modules(by_stage[stage])
    assert loaded[stage] <= modules(sources_by_stage([stage], exempt=())[stage])


def test_train_depends_on_what_the_old_table_left_out(by_stage):
    """The hand-written table missed the scripted motion, cameras, quaternions, voxels, the
    config and the memory tiers (each found where it is defined now)."""
    names = [
        "load_motion",  # the scripted motion.json (the oracle's target)
        "sample_training_cameras",
        "to_rotmat",  # quaternions
        "solid_voxels",  # the second layer's voxels
        "training_hash",  # the config
        "recorded",  # the out-of-memory record
    ]
    for name, path in defined_in(names).items():
        assert path in by_stage["train"], name


def lazy_imports(files) -> set[str]:
    """Package modules that ``files`` import inside a function body."""
    found = set()
    for path in (f for f in files if f.suffix == ".py"):
        tree = ast.parse(path.read_bytes())
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(scope):
                if isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    found.add(node.module)
                    found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if cs.module_file(name) is not None}


@pytest.mark.parametrize("stage", STAGES)
def test_imports_inside_functions_are_sources(stage, by_stage, loaded):
    """A lazy import is a dependency: every package module a stage's source files import in
    a function (not exempt) is a source, and what the sources hold beyond the import-time
    closure is reached from such imports (the training's Tiny VAE, for one)."""
    lazy = lazy_imports(by_stage[stage]) - set(EXEMPT)
    assert modules(cs.closure(lazy)) <= modules(by_stage[stage])
    assert modules(by_stage[stage]) - loaded[stage] <= modules(cs.closure(lazy))
    if stage == "train":
        assert modules(by_stage[stage]) - loaded[stage], "the training imports nothing lazily?"


def test_exempt_modules_exist_and_are_no_source(by_stage):
    """Each exempt name is a module of the package (a rename must update the list), and no
    stage lists one; what the workflow leaves out beyond them is reachable only through
    them."""
    exempt_files = {cs.module_file(name) for name in EXEMPT}
    assert None not in exempt_files, {n: cs.module_file(n) for n in EXEMPT}
    via_exempt = cs.closure(EXEMPT, exempt=())
    full = sources_by_stage(exempt=())
    for stage, files in by_stage.items():
        assert not exempt_files & set(files), stage
        assert set(full[stage]) - set(files) <= via_exempt, stage


ANY = None  # every name of the module
# Each exempt module that stages' sources import, the names they take from it, and why none of
# those can change a result. Which modules and names the stages take is derived from their
# imports (test below); a module that a stage computes with (a loss, the seeds, the cameras)
# cannot be exempted by adding it to EXEMPT alone: its uses fail here until declared, with a
# reason they could not honestly have.
NEUTRAL_USES = {
    "chord.core.errors": ({"InputError"}, "raised on bad input: the stage stops"),
    "chord.core.atomic_files": (
        {"atomic_path", "atomic_dir", "read_json", "write_json"},
        "how a file is written (or a JSON read) whole, not what it holds",
    ),
    "chord.plan.results_layout": (ANY, "output names: a new name is a new target"),
    "chord.resources.peak_memory": (
        ANY,
        "the memory model: which tier a job asks for, whether the float32 fallback fits "
        "(if not, the run stops)",
    ),
    "chord.resources.job_memory": ({"preview_estimate"}, "a job's memory estimate, logged"),
    "chord.resources.gpus": ({"Node", "job_gpu", "job_gpus", "matches"}, "which GPUs a job takes"),
    "chord.resources.cuda_settings": ({"empty_cache"}, "frees cached GPU memory"),
    "chord.resources.machine": ({"host_bytes"}, "the host RAM the float32 fallback checks"),
    "chord.checks.preflight": ({"preflight"}, "a training passes its checks or stops"),
    "chord.checks.capacity": ({"control_points"}, "a count for the preflight's memory check"),
    "chord.training.device_report": (
        {"describe_device", "gpu_peak_gb", "log_measured_memory", "log_memory_estimate"},
        "the device and memory lines of the log and the progress records",
    ),
}


def exempt_uses(path: Path) -> dict[str, set[str]]:
    """The exempt modules the package file ``path`` imports, each with the names it takes from
    it: ``from <module> import <name>``, and ``<alias>.<name>`` where the module itself is
    imported (``from chord.x import m``, ``import chord.x.m as a``, ``import chord.x.m``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_bytes())
    taken: dict[str, set[str]] = {}
    aliases = {}  # a name bound to an exempt module -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                if base in EXEMPT:
                    taken.setdefault(base, set()).add(alias.name)
                elif f"{base}.{alias.name}" in EXEMPT:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in EXEMPT:
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = aliases.get(ast.unparse(node.value))
            if owner is not None:
                taken.setdefault(owner, set()).add(node.attr)
    return taken


def test_stages_use_exempt_modules_only_in_their_declared_neutral_ways(by_stage):
    """Every exempt module that a stage's sources import is in NEUTRAL_USES, and they take no
    name from it beyond those declared: a module the training computes with, added to EXEMPT,
    fails here (its edits would re-run nothing)."""
    sources = sorted({f for files in by_stage.values() for f in files if f.suffix == ".py"})
    wrong = []
    for path in sources:
        for module, names in sorted(exempt_uses(path).items()):
            allowed = NEUTRAL_USES.get(module, (set(), None))[0]
            extra = set() if allowed is ANY else names - allowed
            if extra:
                wrong.append(f"{module_name(path)} takes {sorted(extra)} from exempt {module}")
    assert not wrong, "a source computes with an exempt module:\n" + "\n".join(wrong)
    assert set(NEUTRAL_USES) <= set(EXEMPT)
    # the walk sees the uses it must: the training's, through each import form
    uses = exempt_uses(cs.module_file("chord.training.trainer"))
    assert uses["chord.resources.cuda_settings"] == {"empty_cache"}
    assert "chord.core.errors" in exempt_uses(cs.module_file("chord.training.checkpoint"))


def test_the_schemas_come_with_the_config_module(by_stage):
    from chord.config import settings

    for stage, files in by_stage.items():
        if cs.module_file("chord.config.settings") in files:
            assert {Path(settings.CONFIG_SCHEMA), Path(settings.SCENES_SCHEMA)} <= set(files), stage


def test_every_stage_module_and_the_package_inits_are_sources(by_stage):
    for stage, files in by_stage.items():
        assert cs.module_file(f"chord.stages.{stage}") in files
        assert {cs.ROOT / "__init__.py", cs.ROOT / "stages/__init__.py"} <= set(files)
        for f in files:  # every package on the way: each folder's __init__.py
            for folder in f.relative_to(cs.ROOT).parents if f.suffix == ".py" else []:
                assert cs.ROOT / folder / "__init__.py" in files, (stage, f)


def test_the_dag_build_stays_torch_free():
    code = (
        "import sys, chord.plan.code_sources as cs; cs.sources_by_stage(); "
        "print('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A fake ``chord`` package under ``root`` from {relative path: source}."""
    for rel, text in files.items():
        path = root / "chord" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "chord"


def test_import_forms_on_a_fake_package(tmp_path):
    """from-imports of names and of submodules, `import a.b`, relative imports, imports in
    functions, classes and try blocks, package inits on the way, data files beside a module
    that locates itself; modules nothing imports and exempt ones stay out."""
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from chord import b, c  # b a module, c a module\n",
            "b.py": "X = 1\n",
            "c.py": "from chord.sub import deep\n",
            "sub/__init__.py": "from .helper import NAME\n",
            "sub/helper.py": "NAME = 'n'\n",
            "sub/deep.py": "import chord.sub.inner.leaf as leaf\n",
            "sub/inner/__init__.py": "",
            "sub/inner/leaf.py": "from ..helper import NAME\nfrom ... import d\n",
            "d.py": "from chord.e import value  # a name in e\n",
            "e.py": "value = 2\n",
            "lazy.py": """
                class K:
                    def f(self):
                        try:
                            from chord import f
                        except ImportError:
                            pass
                """,
            "f.py": "",
            "cfg.py": """
                from pathlib import Path
                DATA = Path(__file__).parent / "tables"
            """,
            "tables/one.yaml": "a: 1\n",
            "tables/two.json": "{}\n",
            "exempted.py": "import chord.only_exempted\n",
            "only_exempted.py": "",
            "unused.py": "",
            "stages/__init__.py": "",
            "stages/ingest.py": """
                import os
                from chord import a
                from chord import exempted
                from chord.stages import geometry

                def run():
                    import chord.lazy
                    from chord import cfg
            """,
            "stages/geometry.py": "",
        },
    )
    found = cs.closure(["chord.stages.ingest"], root=pkg, exempt=["chord.exempted"])
    rel = {f.relative_to(pkg).as_posix() for f in found}
    assert rel == {
        "__init__.py",
        "a.py",
        "b.py",
        "c.py",
        "sub/__init__.py",
        "sub/helper.py",
        "sub/deep.py",
        "sub/inner/__init__.py",
        "sub/inner/leaf.py",
        "d.py",
        "e.py",
        "lazy.py",
        "f.py",
        "cfg.py",
        "tables/one.yaml",
        "tables/two.json",
        "stages/__init__.py",
        "stages/ingest.py",
        "stages/geometry.py",
    }


def test_only_a_module_that_locates_itself_reads_data_files_and_only_the_packages(tmp_path):
    """A string names a data file only in a module that uses ``__file__`` (not one that just
    mentions it); a pattern or template string is no name, and the strings after it still
    count; the package folder itself and files outside it are never data."""
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "mentions.py": '"""Not located by __file__."""\nNAME = "tables/one.yaml"\n',
            "reads.py": """
                from pathlib import Path
                PATTERN = "{name}.yaml"
                HERE = Path(__file__).parent
                FILES = [HERE / "../../outside.txt", HERE / "../chord", HERE / "tables/one.yaml"]
            """,
            "tables/one.yaml": "a: 1\n",
            "tables/two.yaml": "b: 2\n",
            "sub/scan.py": 'from pathlib import Path\nHERE, SEP = Path(__file__).parent, ""\n',
            "sub/notes.txt": "beside scan.py, named by no string\n",
            "folder.py": 'from pathlib import Path\nTABLES = Path(__file__).parent / "tables"\n',
            "tables/convert.py": "# a module beside the data, not data\n",
            "tables/__pycache__/convert.cpython-311.pyc": "",
            "tables/more/three.yaml": "c: 3\n",
        },
    )
    (tmp_path / "outside.txt").write_text("not the package's\n")
    rel = {f.relative_to(pkg).as_posix() for f in cs.closure(["chord.mentions"], root=pkg)}
    assert rel == {"__init__.py", "mentions.py"}
    found = cs.closure(["chord.reads"], root=pkg)
    assert all(f.is_relative_to(pkg) for f in found)
    rel = {f.relative_to(pkg).as_posix() for f in found}
    assert rel == {"__init__.py", "reads.py", "tables/one.yaml"}
    rel = {f.relative_to(pkg).as_posix() for f in cs.closure(["chord.sub.scan"], root=pkg)}
    assert rel == {"__init__.py", "sub/scan.py"}  # "" names no file, nor its folder
    rel = {f.relative_to(pkg).as_posix() for f in cs.closure(["chord.folder"], root=pkg)}
    assert rel == {
        "__init__.py",
        "folder.py",
        "tables/one.yaml",
        "tables/two.yaml",
        "tables/more/three.yaml",
    }  # a folder's files, not its folders, Python files or caches


def test_imports_in_except_finally_else_and_match_blocks_are_sources(tmp_path):
    """The walker's docstring claims every block an import can sit in: here each import is
    the only statement of an ``except`` handler, a ``finally``, a loop's ``else`` or a
    ``match`` case."""
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "in_except.py": "",
            "in_finally.py": "",
            "in_else.py": "",
            "in_case.py": "",
            "in_default.py": "",
            "stages/__init__.py": "",
            "stages/ingest.py": """
                def run(kind):
                    try:
                        pass
                    except ValueError:
                        from chord import in_except
                    finally:
                        import chord.in_finally
                    for _ in ():
                        pass
                    else:
                        from chord import in_else
                    match kind:
                        case "a":
                            from chord import in_case
                        case _:
                            import chord.in_default
            """,
        },
    )
    found = cs.closure(["chord.stages.ingest"], root=pkg, exempt=[])
    names = {f.name for f in found}
    assert {"in_except.py", "in_finally.py", "in_else.py", "in_case.py", "in_default.py"} <= names


def test_digest_follows_names_and_contents_not_the_location(tmp_path):
    files = sources("aggregate")
    copy = tmp_path / "elsewhere" / "chord"
    shutil.copytree(cs.ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    moved = [copy / f.relative_to(cs.ROOT) for f in files]
    assert digest(moved, root=copy) == digest(files)  # the same code anywhere
    renamed = moved[-1].with_name(f"renamed_{moved[-1].name}")
    moved[-1].rename(renamed)
    assert digest([*moved[:-1], renamed], root=copy) != digest(files)
    renamed.write_text(renamed.read_text() + "\n# edited\n")
    renamed.rename(moved[-1])
    assert digest(moved, root=copy) != digest(files)


def test_unknown_stage_is_an_error():
    with pytest.raises(ValueError, match="not one of"):
        sources("train_coarse")


def test_the_kept_lists_are_the_found_ones_until_the_package_changes(tmp_path, monkeypatch):
    """cached_sources_by_stage (every Snakemake start): the first call finds the lists and
    keeps them, the next reads them without parsing, an edit anywhere in the package (an
    added import) finds them again, and a damaged file is found again and rewritten."""
    copy = tmp_path / "pkg" / "chord"
    shutil.copytree(cs.ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / ".snakemake" / "chord" / "code_sources.json"
    found = cs.cached_sources_by_stage(cache, root=copy)
    assert found == cs.sources_by_stage(root=copy) and cache.is_file()

    def parsed(*args, **kwargs):
        raise AssertionError("the kept lists were not read")

    with monkeypatch.context() as m:
        m.setattr(cs, "sources_by_stage", parsed)
        assert cs.cached_sources_by_stage(cache, root=copy) == found
    trainer = copy / "training" / "trainer.py"
    assert trainer not in found["aggregate"]
    aggregate = copy / "stages" / "aggregate.py"
    aggregate.write_text(aggregate.read_text() + "\nimport chord.training.trainer  # edited\n")
    edited = cs.cached_sources_by_stage(cache, root=copy)
    assert trainer in edited["aggregate"] and edited == cs.sources_by_stage(root=copy)
    cache.write_text('{"key": ')
    assert cs.cached_sources_by_stage(cache, root=copy) == edited
    kept = json.loads(cache.read_text())["stages"]["aggregate"]
    assert kept == [str(p) for p in edited["aggregate"]]


def test_lists_that_cannot_be_kept_are_still_found(tmp_path):
    """A cache path that cannot be written (its folder is a file) costs the next start a
    parse, not the run: the lists are returned and nothing is written."""
    blocker = tmp_path / "snakemake"
    blocker.write_text("a file where the cache's folder would be\n")
    found = cs.cached_sources_by_stage(blocker / "code_sources.json")
    assert found == sources_by_stage()
    assert blocker.read_text() == "a file where the cache's folder would be\n"

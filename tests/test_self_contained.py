"""A clone is the whole project: no code or test names a path outside the repository.

A user's clone has no folder beside it; a test that reads one fails there (or skips) while CI,
run in a checkout that has it, stays green. `.ci/run` runs the suite in a fresh clone to prove
the same at run time; this test names the offending line at once."""

import re
import subprocess

from tests.conftest import REPO

# Where code lives: the package, the workflow, the tests, the benchmarks, CI.
FOLDERS = ["chord", "rules", "workflow", "bench", "tests", ".ci", "profiles", "config"]
FILES = ["Snakefile", "pyproject.toml"]
# Ways to name the folder beside the repository (or the machine's own copy of it).
OUTSIDE = re.compile(r"\.\./shared|/work/shared|REPO\.parent|\bparents\[\d+\]\s*/\s*\"shared\"")
TEXT = {".py", ".smk", ".yaml", ".yml", ".sh", ".toml", ".json", ".md", ".txt", ".tsv", ""}


def tracked() -> list[str]:
    proc = subprocess.run(
        ["git", "ls-files", "--", *FOLDERS, *FILES], cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.split()
    # Not a git checkout (an unpacked archive): every file under the same folders.
    found = [p for f in FOLDERS for p in (REPO / f).rglob("*") if p.is_file()]
    return [str(p.relative_to(REPO)) for p in found] + [f for f in FILES if (REPO / f).is_file()]


def test_nothing_names_a_folder_outside_the_repository():
    hits = []
    for name in tracked():
        path = REPO / name
        if "node_modules" in path.parts or path.suffix not in TEXT or not path.is_file():
            continue
        if name == "tests/test_self_contained.py":
            continue  # the pattern itself
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{name}:{number}: {line.strip()}")
    assert not hits, "names a path outside the repository:\n" + "\n".join(hits)

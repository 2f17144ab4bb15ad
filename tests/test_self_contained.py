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
OUTSIDE = re.compile(
    r"\.\./shared|/work/shared|REPO\.parent\b|(\.parent|\bparents\[\d+\])\s*/\s*[\"']shared[\"']"
)
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


def test_ci_runs_the_readmes_test_command_in_a_fresh_clone():
    """.ci/run finds the README's test command (its own extraction, run here) and runs it in a
    new clone: the command installs what needs no root (torch pinned, the lock, npm's tools when
    npm is there) and ends in pytest."""
    ci = (REPO / ".ci/run").read_text()
    extract = next(line for line in ci.splitlines() if line.startswith('command="$(awk'))
    proc = subprocess.run(
        ["bash", "-c", f'{extract}\nprintf %s "$command"'],
        env={"repo": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    command = proc.stdout
    assert proc.returncode == 0 and command.count("\n") == 0, proc.stderr
    assert "pip install --require-hashes -r requirements/test.txt" in command
    assert "command -v npm" in command and "(cd tests/tools && npm ci" in command
    assert command.endswith(".venv/bin/python -m pytest")
    assert 'git clone --quiet --no-local "$repo"' in ci and 'bash -c "$command"' in ci

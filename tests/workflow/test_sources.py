"""Code changes and re-runs (issue 15): on the finished tiny run of test_scale, editing any
chord file a stage depends on (chord.plan.code_sources.sources) re-plans exactly those stages and
what
follows them in the DAG, and editing any other package file re-plans nothing.

Each file's wiring is read per file from what the code jobs were given (their logs list their
inputs); the re-plans are dry runs, one per set of files with the same stages (all of them
edited at once: the same stages re-plan whichever one changed). Each edit appends a comment and
is undone (content and time) before the next.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from chord.plan import code_sources as cs
from chord.plan import results_layout as P
from tests.workflow.test_scale import snakemake
from tests.workflow.test_workflow import planned_jobs

COMMENT = {".py": "\n# edited\n", ".yaml": "\n# edited\n", ".yml": "\n# edited\n"}


def rule_graph(work: Path) -> dict[str, set[str]]:
    """Rule -> the rules that read its outputs (snakemake --rulegraph)."""
    dot = snakemake(work, "--rulegraph").stdout
    names = dict(re.findall(r'^\s*(\d+)\[label = "([^"]+)"', dot, re.MULTILINE))
    readers: dict[str, set[str]] = {name: set() for name in names.values()}
    for a, b in re.findall(r"^\s*(\d+) -> (\d+)\s*$", dot, re.MULTILINE):
        readers[names[a]].add(names[b])
    return readers


def downstream(rules: set[str], readers: dict[str, set[str]]) -> set[str]:
    """``rules`` and every rule after them in the DAG, without the target rule all."""
    found, todo = set(), list(rules)
    while todo:
        rule = todo.pop()
        if rule not in found:
            found.add(rule)
            todo.extend(readers.get(rule, ()))
    return found - {"all"}


def stage_rules(stage: str, readers: dict[str, set[str]]) -> set[str]:
    """The rules of a stage in this workflow (train: train_coarse, and train_fine if used;
    demo: the demo_<name> rules)."""
    names = {"train_coarse", "train_fine"} if stage == "train" else {stage}
    if stage == "demo":
        names = {r for r in readers if r.startswith("demo_")}
    return names & set(readers)


def dry_run_after_editing(work: Path, paths: list[Path]) -> dict[str, int]:
    """The jobs a dry run plans with a comment appended to each of ``paths``; then each is put
    back as it was, content and modification time (the other tests share this state)."""
    saved = [(p, p.read_bytes(), p.stat()) for p in paths]
    try:
        for path, data, _ in saved:
            path.write_bytes(data + COMMENT.get(path.suffix, "\n").encode())
        return planned_jobs(snakemake(work, "-n"))
    finally:
        for path, data, stat in saved:
            path.write_bytes(data)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_editing_a_source_reruns_exactly_the_stages_that_depend_on_it(finished):
    work, _ = finished
    pkg = work / "wf/chord"
    assert planned_jobs(snakemake(work, "-n")) == {}
    by_stage = cs.sources_by_stage(root=pkg)
    readers = rule_graph(work)
    # the stages of the default targets (preview is a target of its own)
    stages = {stage for stage in by_stage if stage_rules(stage, readers)}
    for stage in stages:  # each code job was given exactly its stage's files
        log = P.code_digest(work / "resources", stage).with_suffix(".log")
        assert sorted(map(Path, log.read_text().split())) == sorted(by_stage[stage]), stage
    used = sorted({f for files in by_stage.values() for f in files})
    groups: dict[frozenset[str], list[Path]] = {}
    for path in used:
        groups.setdefault(frozenset(s for s in stages if path in by_stage[s]), []).append(path)
    wrong = {}
    for group_stages, paths in groups.items():
        first = set().union(*(stage_rules(s, readers) for s in group_stages))
        expected = {"code"} | downstream(first, readers) if group_stages else set()
        jobs = dry_run_after_editing(work, paths)
        if set(jobs) != expected or jobs.get("code", 0) != len(group_stages):
            names = [p.relative_to(pkg).as_posix() for p in paths]
            wrong[" ".join(names)] = (sorted(jobs.items()), sorted(expected))
    assert not wrong, wrong
    # every other package file (the exempt modules, the CLI, adapters...) re-plans nothing,
    # all of them edited at once
    others = [
        p
        for p in sorted(pkg.rglob("*"))
        if p.is_file() and p not in used and "__pycache__" not in p.parts
    ]
    assert {cs.module_file(name, pkg) for name in cs.EXEMPT} <= set(others)
    assert dry_run_after_editing(work, others) == {}
    assert planned_jobs(snakemake(work, "-n")) == {}  # every edit undone

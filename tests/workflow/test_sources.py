"""Code changes and re-runs (issue 15): on the finished tiny run of test_scale, editing any
chord file a stage depends on (chord.plan.code_sources.sources) re-plans exactly those stages and
what
follows them in the DAG, and editing any other package file re-plans nothing.

Each file's wiring is read per file from what the code jobs were given (their logs list their
inputs); the re-plans are dry runs, one per set of files with the same stages (all of them
edited at once: the same stages re-plan whichever one changed). Each edit appends a comment and
is undone (content and time) before the next.

The upgrade commands of docs/upgrading.md run on a copy of that run after a simulated
release that moves a module and rewrites every other: they keep every result and leave the new
digests.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
from pathlib import Path

from chord.plan import code_sources as cs
from chord.plan import results_layout
from tests.conftest import REPO
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
        log = results_layout.code_digest(work / "resources", stage).with_suffix(".log")
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


# docs/upgrading.md: the line before its commands' bash block
UPGRADE_LINE = "To keep finished results, run once after upgrading"
# the module the simulated upgrade moves (most stages use it); it is named only by this dotted
# name, in both import forms, so a text replace moves every reference
MOVED = ("chord.config.sheet", "chord.config.scene_sheet")


def upgrade_commands() -> list[list[str]]:
    """The upgrade commands of docs/upgrading.md (the first bash block after UPGRADE_LINE),
    each as Snakemake's arguments: the test runs what the page says."""
    text = (REPO / "docs" / "upgrading.md").read_text()
    after = text.split(f"\n{UPGRADE_LINE}", 1)[1]
    block = after.split("```bash\n", 1)[1].split("\n```", 1)[0]
    commands = [shlex.split(c) for c in re.split(r"&&|\n", block) if c.strip()]
    assert commands and all(c[0] == "snakemake" for c in commands), block
    return [c[1:] for c in commands]


def simulate_upgrade(wf: Path) -> None:
    """What a release that moves modules does to a checkout (issue 35): MOVED's file goes to
    its new name with every reference rewritten (the stages' file sets change), and every
    package module and adapter is rewritten (their contents and times change)."""
    src = cs.module_file(MOVED[0], wf / "chord")
    src.rename(src.with_name(MOVED[1].rpartition(".")[2] + ".py"))
    for path in [*(wf / "chord").rglob("*.py"), *(wf / "rules").glob("*.smk")]:
        text = path.read_text()
        if MOVED[0] in text:
            path.write_text(text.replace(MOVED[0], MOVED[1]))
    for path in [*(wf / "chord").rglob("*.py"), *(wf / "workflow/scripts").glob("*.py")]:
        path.write_text(path.read_text() + "\n# upgraded\n")


def results_files(work: Path) -> dict[str, tuple[str, int]]:
    """Each file under results/: its sha256 and inode (an atomic rewrite is a new inode)."""
    return {
        p.relative_to(work).as_posix(): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_ino,
        )
        for p in sorted((work / "results").rglob("*"))
        if p.is_file()
    }


def test_the_upgrade_page_keeps_finished_results_and_live_digests(finished, tmp_path):
    """docs/upgrading.md: after a release that moves modules, every code digest changes and
    everything would re-run; the page's commands write the new digests and keep every result
    (same bytes, not rewritten: Snakemake's touch only updates times); then nothing is planned
    and a later edit re-plans what it should. On a copy of the finished run: nothing shared."""
    work = tmp_path / "upgrade"
    shutil.copytree(finished[0], work, symlinks=True, copy_function=shutil.copy2)
    # the code jobs record their inputs by absolute path: in the copy they re-run once and
    # write the same digests, so nothing else does (a moved checkout does the same)
    assert set(planned_jobs(snakemake(work, "--until", "code"))) <= {"code"}
    assert planned_jobs(snakemake(work, "-n")) == {}
    pkg = work / "wf/chord"
    readers = rule_graph(work)
    stages = sorted(stage for stage in cs.STAGES if stage_rules(stage, readers))

    def digests() -> dict[str, str]:
        return {
            s: results_layout.code_digest(work / "resources", s).read_text().strip() for s in stages
        }

    before, old_digests = results_files(work), digests()
    old_sources, old_file = cs.sources_by_stage(stages, root=pkg), cs.module_file(MOVED[0], pkg)
    simulate_upgrade(work / "wf")
    new_sources, new_file = cs.sources_by_stage(stages, root=pkg), cs.module_file(MOVED[1], pkg)
    users = [s for s in stages if old_file in old_sources[s]]  # their file sets change
    assert users and users == [s for s in stages if new_file in new_sources[s]]
    for stage in stages:  # and every stage's contents
        assert cs.digest(new_sources[stage], root=pkg) != old_digests[stage], stage
    # without the page's commands everything re-runs, training included
    everything = planned_jobs(snakemake(work, "-n", "--forceall"))
    assert planned_jobs(snakemake(work, "-n")) == everything
    assert "train_coarse" in everything
    for args in upgrade_commands():
        snakemake(work, *args)
    assert planned_jobs(snakemake(work, "-n")) == {}
    assert results_files(work) == before  # every result kept: same bytes, same file
    # the digests are the new code's, not the old ones kept
    assert digests() == {s: cs.digest(new_sources[s], root=pkg) for s in stages}
    # and live: editing one stage's module re-plans that stage and what follows it
    expected = {"code"} | downstream(stage_rules("export", readers), readers)
    jobs = dry_run_after_editing(work, [pkg / "stages/export.py"])
    assert set(jobs) == expected and jobs["code"] == 1, jobs

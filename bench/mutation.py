"""Mutation testing of the core modules on demand (issue 41), with cosmic-ray.

    python bench/mutation.py [module ...] [--max N] [--survivors FILE] [--keep]

For each module of :data:`TARGETS` (all when none is named): a throwaway copy of the
repository (the files git knows, committed or not; the working tree is never mutated), the
module's targeted tests run once unmutated (their wall time sets the per-mutant timeout),
``cosmic-ray init`` on the module, the mutants kept by :data:`OPERATORS` and :func:`not_run`
(the module's ``only`` definitions; no log call, annotation or parameter marker), a seeded
sample of at most ``--max`` of them, then ``cosmic-ray exec``: each mutant is written into the
copy and the targeted tests run in a fresh process (stopping at the first failure). It
prints a Markdown table: module, mutants, killed, survived, timeout (counted as killed in the
score), score; and each survivor's diff (to ``--survivors`` when given). Not part of CI:
about 25 minutes for every module on two cores. Needs the ``mutation`` extra
(``pip install -e '.[mutation]'``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Target:
    """A module to mutate: ``module`` (its path), ``tests`` (pytest arguments: files or node
    ids, the quick tests that target it), ``slow`` (node ids, or their prefix, left out of
    ``tests``: a new test in those files runs unless listed) and ``only`` (top-level names
    whose lines are mutated; every line when empty)."""

    module: str
    tests: tuple[str, ...]
    only: tuple[str, ...] = ()
    slow: tuple[str, ...] = ()


T = "tests/unit/"
TARGETS: dict[str, Target] = {
    "resume": Target("chord/training/resume.py", (f"{T}training/test_resume.py",)),
    "checkpoint": Target("chord/training/checkpoint.py", (f"{T}training/test_checkpoint.py",)),
    "run_loop": Target(
        "chord/training/run_loop.py",
        (f"{T}training/test_run_loop.py",),
        slow=tuple(
            f"{T}training/test_run_loop.py::test_{name}"
            for name in (  # whole trainings on the tiny scene, 3-45 s each
                "memory_modes_give_the_default_gradients",
                "tiny_vae_checkpoints_give_the_default_gradients",
                "split_backward_renders_each_video_once_without_grad",
                "coarse_then_fine_equals_one_run",
                "training_moves_toward_the_oracle_target",
                "non_finite_steps_roll_back_and_fall_back_to_float32",
                "non_finite_fallback_none_keeps_the_guidance_precision",
                "split_render_backward_empties_the_cuda_cache_after_each_chunk",
                "nan_from_the_teacher_is_a_non_finite_step_that_rolls_back",
                "float32_fallback_is_not_taken_where_the_memory_model_says_it_will_not_fit",
                "the_contact_loss_keeps_a_block_out_of_the_slab_its_teacher_pushes_it_into",
                "the_support_loss_keeps_a_resting_block_on_the_slab_its_teacher_lifts_it_off",
            )
        ),
    ),
    "slurm_time_limit": Target(
        "chord/training/slurm_time_limit.py",
        (
            f"{T}training/test_slurm_time_limit.py",
            "tests/stages/test_time_limit.py::test_the_requeue_is_logged_before_slurm_stops_the_run",
        ),
    ),
    "tiers": Target(
        "chord/resources/tiers.py",
        (
            f"{T}resources/test_tiers.py",
            f"{T}resources/test_multi_gpu_tiers.py",
            f"{T}plan/test_workflow_jobs.py",
        ),
    ),
    "out_of_memory": Target(
        "chord/resources/out_of_memory.py",
        (f"{T}resources/test_out_of_memory.py", f"{T}resources/test_tiers.py"),
    ),
    "result_keys": Target(
        "chord/config/result_keys.py",
        (f"{T}config/test_result_keys.py", f"{T}config/test_settings.py"),
    ),
    "code_sources": Target(
        "chord/plan/code_sources.py",
        (f"{T}plan/test_code_sources.py",),
    ),
    "scene_plan": Target(
        "chord/plan/scene_plan.py",
        (f"{T}plan/test_scene_plan.py", f"{T}plan/test_workflow_jobs.py"),
    ),
    "rfsds": Target("chord/guidance/rfsds.py", (f"{T}guidance/test_rfsds.py",)),
    "regularisers": Target("chord/motion/regularisers.py", (f"{T}motion/test_regularisers.py",)),
    # issue 49: ARAP's rotations, moved out of regularisers (Horn's quaternion, the SVD's rotation)
    "procrustes": Target(
        "chord/core/procrustes.py",
        (f"{T}core/test_procrustes.py", f"{T}motion/test_regularisers.py"),
    ),
    "contact": Target("chord/motion/contact.py", (f"{T}motion/test_contact.py",)),
    "read_accessor": Target(
        "chord/gltf/container.py",
        (f"{T}gltf/test_container.py", f"{T}gltf/test_reader.py", f"{T}gltf/test_untrusted.py"),
        only=("read_accessor", "COMPONENTS", "WIDTH", "FLOAT"),
    ),
    # issue 47: the node hierarchy's composition, judged against trimesh's scene graph
    "world_matrices": Target(
        "chord/gltf/container.py",
        (f"{T}gltf/test_animated.py", f"{T}gltf/test_container.py", f"{T}gltf/test_skinned.py"),
        only=("world_matrices", "node_matrix"),
        slow=(f"{T}gltf/test_skinned.py::test_blender_plays_the_skinned_glb_at_its_keys",),
    ),
    # the contact and support losses alone (the "contact" target mutates the whole module)
    "contact_loss": Target(
        "chord/motion/contact.py",
        (f"{T}motion/test_contact.py",),
        only=("contact_loss", "support_loss", "depth", "DistanceGrid"),
    ),
    "peak_memory": Target(
        "chord/resources/peak_memory.py",
        (
            f"{T}resources/test_peak_memory.py",
            f"{T}resources/test_tiers.py",
            f"{T}resources/test_multi_gpu_tiers.py",
        ),
        only=(
            "estimate",
            "summary",
            "_chunk_graph",
            "fits",
            "tokens",
            "latent_shape",
            "dit_params",
            "dit_block_params",
            "contact_grid_bound",
        ),
    ),  # fmt: skip
    # the exporters: the animated glTF writers and the USD export
    "morphed_glb": Target(
        "chord/gltf/mesh_scene.py",
        (f"{T}gltf/test_animated.py",),
        only=("morph_object", "morph_mesh"),
    ),
    "animated_scene": Target("chord/gltf/animated_scene.py", (f"{T}gltf/test_animated.py",)),
    "skinned_glb": Target(
        "chord/gltf/skinned.py",
        (f"{T}gltf/test_skinned.py",),
        slow=(f"{T}gltf/test_skinned.py::test_blender_plays_the_skinned_glb_at_its_keys",),
    ),
    "splats_glb": Target(
        "chord/gltf/splats.py", (f"{T}gltf/test_splats.py", f"{T}gltf/test_rigid_splats.py")
    ),
    "usd": Target("chord/export/usd.py", (f"{T}export/test_usd.py",)),
}

# The operators kept: the defects a reviewer plants (a boundary moved, a condition dropped or
# negated, a sign or a unit wrong, an off-by-one, a handler that never runs), each operator
# replaced by its nearest counterpart only (cosmic-ray's core set replaces each binary operator
# by all eleven others: mostly type errors, killed at once, and ten times the run time).
OPERATORS = re.compile(
    r"core/("
    r"ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Div|Mod_FloorDiv|Pow_Mul"
    r"|BitOr_BitAnd|BitAnd_BitOr)"
    r"|ReplaceComparisonOperator_(Eq_NotEq|NotEq_Eq|Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Is_IsNot|IsNot_Is)"
    r"|ReplaceUnaryOperator_(USub_UAdd|Delete_Not)"
    r"|AddNot|ReplaceTrueWithFalse|ReplaceFalseWithTrue|ReplaceAndWithOr|ReplaceOrWithAnd"
    r"|ReplaceBreakWithContinue|ReplaceContinueWithBreak|ExceptionReplacer|NumberReplacer"
    r"|ZeroIterationForLoop|RemoveDecorator"
    r")$"
)
LOGGERS = {"logger", "log", "logging", "warnings"}
SEED = 41


def copy_repo(dest: Path) -> None:
    """The files git knows (tracked, and untracked ones not ignored) copied into ``dest``."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    for name in filter(None, out.decode().split("\0")):
        src = REPO / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name, follow_symlinks=False)


def stop_tests_in(copy: Path) -> None:
    """Ends the test processes running in ``copy`` (cosmic-ray starts each in a session of its
    own, so they outlive it)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.joinpath("cwd").resolve() == copy.resolve():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


def test_command(target: Target) -> str:
    return " ".join(
        [sys.executable, "-m", "pytest", "-n", "0", "-x", "-q", "-p", "no:cacheprovider"]
        + list(target.tests)
        + [f"--deselect={node}" for node in target.slow]
    )


def not_run(source: str, only: tuple[str, ...]):
    """A predicate of (line, column): whether a mutant there changes nothing that runs or
    that a user reads. Outside the top-level definitions or assignments named in ``only``
    (when any); in a log call (only a message changes); in an annotation (never evaluated:
    ``from __future__ import annotations``); or the ``*`` or ``/`` that marks keyword-only or
    positional-only parameters (cosmic-ray takes it for an operator)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    keep: set[int] | None = None
    if only:
        keep = set()
        for node in tree.body:
            names = set()
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = {node.name}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
            if names & set(only):
                keep.update(range(node.lineno, node.end_lineno + 1))
    logs: set[int] = set()
    spans = []  # annotations: ((line, col), (end line, end col))
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            while isinstance(func, ast.Attribute):
                func = func.value
            if isinstance(func, ast.Name) and func.id in LOGGERS:
                logs.update(range(node.lineno, node.end_lineno + 1))
        notes = []
        if isinstance(node, ast.arg):
            notes = [node.annotation]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            notes = [node.returns]
        elif isinstance(node, ast.AnnAssign):
            notes = [node.annotation]
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes if n]

    def skipped(line: int, col: int) -> bool:
        rest = lines[line - 1][col:].rstrip()
        marker = rest in ("*", "/") or rest[:2] in ("*,", "/,", "*)", "/)")
        return (
            (keep is not None and line not in keep)
            or line in logs
            or marker
            or any(a <= (line, col) < b for a, b in spans)
        )

    return skipped


def rank(m) -> str:
    key = f"{SEED}:{m.module_path}:{m.operator_name}:{m.start_pos}:{m.occurrence}"
    return hashlib.sha256(key.encode()).hexdigest()


def select(db, target: Target, source: str, limit: int) -> tuple[int, int]:
    """Marks as skipped the mutants not kept (operator, lines, sample); returns (kept, all)."""
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    skipped = not_run(source, target.only)
    items = sorted(
        db.pending_work_items,
        key=lambda w: (w.mutations[0].operator_name, w.mutations[0].occurrence),
    )
    chosen = []
    for item in items:
        m = item.mutations[0]
        if OPERATORS.match(m.operator_name) and not skipped(*m.start_pos):
            chosen.append(item)
    # the sample: the mutants of the lowest seeded hashes of (operator, place), so a smaller
    # --max takes part of a larger one's sample, and mutants left out by a filter change only
    # themselves
    chosen.sort(key=lambda w: rank(w.mutations[0]))
    run = {item.job_id for item in chosen[:limit]}
    skipped = [item.job_id for item in items if item.job_id not in run]
    db.set_multiple_results(
        skipped, WorkResult(output="not selected", worker_outcome=WorkerOutcome.SKIPPED)
    )
    return len(run), len(chosen)


def run_target(name: str, target: Target, copy: Path, args, env) -> dict:
    """The row of ``name`` and its survivors' diffs."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    row = {"module": name, "mutants": 0, "killed": 0, "survived": 0, "timeout": 0, "note": ""}
    missing = [t for t in target.tests if not (copy / t.split("::")[0]).exists()]
    if missing:
        row["note"] = f"no test file {', '.join(missing)}"
        return {"row": row, "survivors": []}
    command = test_command(target)
    began = time.monotonic()
    base = subprocess.run(command.split(), cwd=copy, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - began
    if base.returncode != 0:
        row["note"] = "the unmutated tests fail: " + base.stdout.strip().splitlines()[-1]
        return {"row": row, "survivors": []}
    timeout = round(args.timeout_factor * seconds + 30)
    config = copy / f"mutation-{name}.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{target.module}"\n'
        f"timeout = {timeout}\n"
        "excluded-modules = []\n"
        f"test-command = {command!r}\n"
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    session = copy / f"mutation-{name}.sqlite"
    cosmic_ray = str(Path(sys.executable).with_name("cosmic-ray"))
    subprocess.run([cosmic_ray, "init", str(config), str(session)], cwd=copy, env=env, check=True)
    source = (copy / target.module).read_text()
    with use_db(str(session), WorkDB.Mode.open) as db:
        kept, eligible = select(db, target, source, args.max)
    print(
        f"{name}: {kept} mutants of {eligible} (tests {seconds:.0f} s unmutated, "
        f"timeout {timeout} s)",
        flush=True,
    )
    proc = subprocess.Popen([cosmic_ray, "exec", str(config), str(session)], cwd=copy, env=env)
    try:
        while True:
            try:
                proc.wait(timeout=60)
                break
            except subprocess.TimeoutExpired:
                with use_db(str(session), WorkDB.Mode.open) as db:
                    done = sum(
                        1 for _, r in db.results if r.worker_outcome != WorkerOutcome.SKIPPED
                    )
                print(f"  {name}: {done}/{kept} done", flush=True)
    finally:
        if proc.poll() is None:  # interrupted: stop cosmic-ray and the tests it started
            proc.terminate()
            stop_tests_in(copy)
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            row["mutants"] += 1
            m = item.mutations[0]
            if result.test_outcome == TestOutcome.SURVIVED:
                row["survived"] += 1
                where = f"{m.module_path}:{m.start_pos[0]} {m.operator_name}"
                survivors.append(f"## {name} {where}\n{result.diff}")
            elif result.output == "timeout":
                row["timeout"] += 1
            elif result.worker_outcome == WorkerOutcome.NORMAL:
                row["killed"] += 1
            else:  # the mutant could not be written or run: not counted
                row["mutants"] -= 1
                row["note"] = f"{result.worker_outcome} mutants left out"
    return {"row": row, "survivors": survivors}


def table(rows: list[dict]) -> str:
    lines = [
        "| module | mutants | killed | survived | timeout | score |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n = r["mutants"]
        score = f"{100 * (r['killed'] + r['timeout']) / n:.0f}%" if n else "-"
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(
            f"| {r['module']}{note} | {n} | {r['killed']} | {r['survived']} | {r['timeout']} "
            f"| {score} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--max", type=int, default=25, help="mutants per module (seeded sample)")
    parser.add_argument(
        "--timeout-factor",
        type=float,
        default=3.0,
        help="a mutant's timeout: this times the unmutated tests' wall time, plus 30 s",
    )
    parser.add_argument("--survivors", type=Path, help="write the survivors' diffs here")
    parser.add_argument("--keep", action="store_true", help="keep the copy (its path is printed)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}: one of {', '.join(TARGETS)}")
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        parser.error("cosmic-ray is not installed: pip install -e '.[mutation]'")
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    commit = commit.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")
    copy = Path(tempfile.mkdtemp(prefix="chord-mutation-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    try:
        copy_repo(copy)
        # the copy's package first, in the tests' own subprocesses too
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
        where = subprocess.run(
            [sys.executable, "-c", "import chord; print(chord.__file__)"],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not where.startswith(str(copy)):
            raise SystemExit(f"the tests would import chord from {where}, not from the copy")
        results = [
            run_target(name, TARGETS[name], copy, args, env) for name in args.modules or TARGETS
        ]
    finally:
        if args.keep:
            print(f"the copy: {copy}")
        else:
            shutil.rmtree(copy, ignore_errors=True)
    survivors = "\n\n".join(s for r in results for s in r["survivors"])
    if args.survivors:
        args.survivors.write_text(survivors + "\n")
    print(f"\nmutation run {time.strftime('%Y-%m-%d')}, commit {commit}, --max {args.max}\n")
    print(table([r["row"] for r in results]))
    if survivors and not args.survivors:
        print("\n" + survivors)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""chord.plan.workflow_jobs: the tier and the job request of each training attempt, asked directly
(no Snakemake): what the rules' resources and params return."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from chord.config import result_keys as rk
from chord.config import settings
from chord.plan import code_sources, results_layout, scene_plan
from chord.plan.workflow_jobs import WorkflowJobs
from chord.resources import job_size, tiers
from chord.resources import out_of_memory as oom
from tests.conftest import REPO, write_still_motion
from tests.unit.plan.test_scene_plan import three_objects


def jobs_of(tmp_path, *, tier="full", **config):
    """A toy scene (two seeds if ``seeds``) on the shipped tiers; the node asks counted."""
    data = three_objects(tmp_path / "data" / "toy")
    write_still_motion(data, ("obj_1",))
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    sheet = tmp_path / "scenes.tsv"
    sheet.write_text(f"scene\tdata\tprompt\ttier\ntoy\t{data}\tp\t{tier}\n")
    base.update(scenes=str(sheet), results=str(tmp_path / "results"), **config)
    conf = settings.load(base)
    asked, said = [], []

    def node():
        asked.append(1)
        return None  # a CPU: auto takes the first tier

    jobs = WorkflowJobs(
        conf,
        tiers.parse(conf.tiers),
        scene_plan=lambda name: scene_plan.scene(conf, name),
        node=node,
        model=None,
        results=conf.results,
        log=said.append,
    )
    return jobs, asked, said


def test_a_retry_after_running_out_of_memory_asks_for_the_next_tiers_resources(tmp_path):
    jobs, asked, _ = jobs_of(tmp_path, sweep={"seeds": [0, 1]})
    names = list(jobs.tiers)
    assert jobs.resource("toy/seed_1", "coarse", "tier", 1) == names[0] == "full"
    # seed 1 ran out of memory on full; seed 0's record is its own and empty
    oom.record(
        results_layout.checkpoints(jobs.results, "toy/seed_1", "coarse") / oom.RECORD, "full"
    )
    assert jobs.resource("toy/seed_1", "coarse", "tier", 2) == names[1]
    assert jobs.resource("toy/seed_0", "coarse", "tier", 2) == names[0]
    runtime = jobs.tiers[names[1]].runtime_min
    assert jobs.resource("toy/seed_1", "coarse", "runtime", 2) == runtime
    # the oracle's host RAM, whatever the tier (its method does not size it)
    assert jobs.resource("toy/seed_1", "coarse", "mem_mb", 2) == job_size.ORACLE_HOST_MB
    assert jobs.preview_mem_mb("toy", 1) == job_size.ORACLE_HOST_MB
    assert asked == []  # a sheet tier: the node is not asked


def test_auto_asks_for_the_node_once_and_says_each_choice_once(tmp_path):
    jobs, asked, said = jobs_of(tmp_path, tier="auto")
    assert jobs.scene_tier("toy") == list(jobs.tiers)[0]  # no GPU: the first tier
    jobs.check_job_requests("toy")
    assert jobs.resource("toy", "coarse", "tier", 1) == jobs.scene_tier("toy")
    assert len(asked) == 1 and len(said) == 1 and said[0].startswith("tier auto: scene toy")


def test_the_training_hash_is_of_the_start_tiers_method_per_run(tmp_path):
    jobs, _, _ = jobs_of(tmp_path, sweep={"seeds": [0, 1]})
    hashes = {run: jobs.training_hash(run) for run in ("toy/seed_0", "toy/seed_1")}
    assert hashes["toy/seed_0"] != hashes["toy/seed_1"]  # the seed changes the result
    start = jobs.tiers[jobs.scene_tier("toy")]
    job = tiers.training_job(
        scene_plan.run_spec(jobs.conf, "toy/seed_1").method, jobs.conf.memory, start
    )
    assert hashes["toy/seed_1"] == job.config_hash(jobs.conf.guidance)


# --- every sheet column a stage reads reaches its rule ----------------------------------------

SHEET = settings.read_schema(settings.SCENES_SCHEMA)["properties"]  # the scene sheet's columns
# The SceneSpec field a column fills, where it is not the column's name: the preset picks the
# method values.
FIELD = {"preset": "method"}
# Where a stage reads the sheet: its adapter (workflow/scripts/<stage>.py), and for the stages
# whose adapter passes the whole config, the stage module itself.
READERS = {
    stage: [REPO / "workflow/scripts" / f"{stage}.py", REPO / "chord/stages" / f"{stage}.py"]
    for stage in code_sources.STAGES
}


# A field a stage reads that its own rule does not carry, as a rule before it in the DAG does:
# the viewer's page title shows the prompt, and a new prompt re-runs the condition, then the
# training and the export whose GLBs the viewer reads (tests/workflow/test_scale.py).
UPSTREAM = {("viewer", "prompt"): "condition"}


def spec_fields_read(path: Path) -> set[str]:
    """The SceneSpec fields ``path`` reads: attributes of a name bound to a scene's spec
    (``scene_spec(...)``, ``run_spec(...)``, ``conf.scenes[...]``) or of such a call itself."""
    if not path.is_file():
        return set()

    def is_spec(node) -> bool:
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            return func.endswith("scene_spec") or func.endswith("run_spec")
        return isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith(".scenes")

    tree = ast.parse(path.read_text())
    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and is_spec(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and (is_spec(node.value) or (isinstance(node.value, ast.Name) and node.value.id in names))
    }


def rule_values(jobs: WorkflowJobs) -> dict[str, dict]:
    """Stage -> {job: (params, input files)} of its rules (rules/<stage>.smk, whose params
    rules/common.smk takes from WorkflowJobs), for each scene of the sheet: what an edit must
    change for Snakemake to re-run the job. Demo scenes' and the report's rules read no row."""
    values: dict[str, dict] = {s: {} for s in code_sources.STAGES}
    for scene in jobs.conf.scenes:
        plan = scene_plan.scene(jobs.conf, scene)
        geometry = plan.geometry_inputs()
        values["ingest"][scene] = (jobs.stage_params(scene, "ingest"), plan.ingest_inputs())
        for obj, ply in plan.gaussians().items():
            fitted = jobs.fitted_ply(scene, obj)
            values["gaussians"][obj] = (jobs.stage_params(scene, "gaussians"), geometry, fitted)
            if obj in plan.dynamic:
                values["voxelize"][obj] = (jobs.stage_params(scene, "voxelize"), geometry, ply)
        values["reference"][scene] = (
            jobs.stage_params(scene, "reference"),
            plan.reference_inputs(),
        )
        values["condition"][scene] = (jobs.condition_params(scene), {})
        values["preview"][scene] = (jobs.preview_params(scene), plan.preview_inputs())
        for run in plan.runs():
            name = run.run
            values["train"][name] = (jobs.training_hash(name), run.train_inputs())
            values["export"][name] = (jobs.stage_params(name, "export"), run.export_inputs())
            values["evaluate"][name] = (
                jobs.stage_params(name, "evaluate"),
                run.evaluate_inputs(),
            )
    return values


# The params each stage's rule passes (rules/<file>.smk), as rule_values computes them: through
# rules/common.smk's function of that name, which returns WorkflowJobs's.
RULE_PARAMS = {
    "ingest": ("ingest", 'method=lambda wc: stage_params(wc.scene, "ingest")'),
    "gaussians": ("gaussians", 'method=lambda wc: stage_params(wc.scene, "gaussians")'),
    "voxelize": ("voxelize", 'method=lambda wc: stage_params(wc.scene, "voxelize")'),
    "reference": ("reference", 'method=lambda wc: stage_params(wc.scene, "reference")'),
    "condition": ("condition", "text=lambda wc: condition_params(wc.scene)"),
    "preview": ("preview", "settings=lambda wc: preview_params(wc.scene)"),
    "train": ("train", "method=lambda wc: train_params(wc.run)"),
    "export": ("export", 'method=lambda wc: stage_params(wc.run, "export")'),
    "evaluate": ("evaluate", 'method=lambda wc: stage_params(wc.run, "evaluate")'),
}
DELEGATES = {  # rules/common.smk's function -> what it returns
    "stage_params": "JOBS.stage_params(name, stage)",
    "condition_params": "JOBS.condition_params(scene)",
    "preview_params": "asked(JOBS.preview_params, scene)",
    "train_params": "asked(JOBS.training_hash, run)",
    "fitted_ply": "JOBS.fitted_ply(wildcards.scene, wildcards.obj)",
}


def test_the_rules_pass_the_params_the_unit_tests_compute():
    """rule_values asks WorkflowJobs what each rule's params are: each rule passes them, and
    rules/common.smk's functions return WorkflowJobs's values unchanged."""
    for stage, (name, line) in RULE_PARAMS.items():
        text = (REPO / "rules" / f"{name}.smk").read_text()
        assert line in text.split("params:", 1)[-1], (stage, line)
    assert "fitted=fitted_ply," in (REPO / "rules/gaussians.smk").read_text()
    common = (REPO / "rules/common.smk").read_text()
    for function, returns in DELEGATES.items():
        body = common.split(f"\ndef {function}(", 1)[1].split("\ndef ", 1)[0]
        assert f"return {returns}\n" in body, function


def sheet_jobs(tmp_path: Path, row: dict) -> WorkflowJobs:
    """The jobs of a sheet of one ``row`` (every column, empty ones too) on the shipped config."""
    folder = tmp_path / f"sheet_{len(list(tmp_path.glob('sheet_*')))}"
    folder.mkdir()
    lines = ["\t".join(SHEET), "\t".join(str(row.get(c) or "") for c in SHEET)]
    (folder / "scenes.tsv").write_text("\n".join(lines) + "\n")
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    base.update(scenes=str(folder / "scenes.tsv"), results=str(tmp_path / "results"))
    conf = settings.load(base)
    return WorkflowJobs(
        conf,
        tiers.parse(conf.tiers),
        scene_plan=lambda name: scene_plan.scene(conf, name),
        node=lambda: None,
        model=None,
        results=conf.results,
        log=lambda line: None,
    )


def fitted_gaussians(folder: Path, objects) -> Path:
    for obj in objects:
        ply = folder / obj / "point_cloud" / "iteration_7" / "point_cloud.ply"
        ply.parent.mkdir(parents=True)
        ply.write_bytes(b"ply\n")
    return folder


def test_every_sheet_column_a_stage_reads_reaches_its_rule(tmp_path):
    """Each column of the sheet schema edited in turn: every stage that reads the field it
    fills (found in the adapters and stages) sees the edit in its rule's params or input
    files, so Snakemake re-runs it; for the preset, every stage that reads a method key it
    changes. A column a stage reads but its rule leaves out (the negative prompt dropped from
    the condition's params) would leave results stale."""
    data = three_objects(tmp_path / "data" / "toy")
    write_still_motion(data, ("obj_1",))
    moved = three_objects(tmp_path / "elsewhere" / "toy")
    write_still_motion(moved, ("obj_1",))
    row = {"scene": "toy", "data": data, "prompt": "a block hops", "tier": "full"}
    before = sheet_jobs(tmp_path, row)
    objects = list(scene_plan.scene(before.conf, "toy").gaussians())
    edits = {  # a new column needs a line here
        "scene": "other",
        "data": moved,
        "prompt": "a block spins",
        "n_prompt": "blurry, static",
        "gaussians": fitted_gaussians(tmp_path / "fitted", objects),
        "tier": "split",
        "preset": "cpu_demo",
        "seeds": "0 1",
    }
    assert set(edits) == set(SHEET)
    readers = {
        stage: set().union(*map(spec_fields_read, files)) for stage, files in READERS.items()
    }
    assert readers["condition"] >= {"prompt", "n_prompt"} and "data" in readers["ingest"]
    assert all(field in readers[stage] for stage, field in UPSTREAM)
    old = rule_values(before)
    spec = before.conf.scenes["toy"]
    missed = []
    for column, value in edits.items():
        after = sheet_jobs(tmp_path, {**row, column: value})
        new = rule_values(after)
        field = FIELD.get(column, column)
        edited = after.conf.scenes[value if column == "scene" else "toy"]
        assert getattr(edited, field) != getattr(spec, field), column  # the edit is one
        keys = None
        if field == "method":  # the stages whose keys the preset changes
            keys = {
                k for k in rk.METHOD_STAGES if getattr(edited.method, k) != getattr(spec.method, k)
            }
        for stage, fields in readers.items():
            if field not in fields or (keys is not None and not keys & set(rk.STAGE_KEYS[stage])):
                continue
            rule = UPSTREAM.get((stage, field), stage)
            if new[rule] == old[rule]:
                missed.append(f"{column}: read by {stage}, whose rule does not change")
    assert not missed, missed

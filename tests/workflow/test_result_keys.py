"""Result keys by construction (issue 23), end to end: on the finished tiny run of test_scale,
a config key edited (an extra --configfile) re-plans exactly the stages whose x-stages name it
and what follows them in the DAG; every guidance key and a sample of method keys, one dry run
of a few seconds each."""

from __future__ import annotations

from chord.config import result_keys as rk
from tests.workflow.test_scale import extra_config, snakemake
from tests.workflow.test_sources import downstream, rule_graph, stage_rules
from tests.workflow.test_workflow import planned_jobs

GUIDANCE = {
    "ckpt_dir": "/models/other",  # the oracle run: the condition stage's encoder, the hash
    "oracle_pool": 4,
    "oracle_gain": 2.5,
    "tiny_vae_path": "/models/t.pth",  # read only by the Wan teacher with use_tiny_vae
    "tiny_vae_normalize": False,
    "max_nonfinite_steps": 9,
    "nonfinite_fallback": "none",
}
METHOD = {
    "gs_init_scale": 1.5,  # gaussians, and the training's checkpoints
    "t5_cpu": True,  # condition
    "lambda_arap": 1.0,  # train
    "ref_azim": 30.0,  # the views: reference, export, evaluate
    "export_size": "32*16",  # export
    "save_fps": 12,  # export
    "static_threshold": 0.5,  # evaluate
    "ex_name": "other",  # no stage
}


def expected_rules(stages: set[str], readers: dict[str, set[str]]) -> set[str]:
    """The rules of ``stages`` (the training's also where a stage it reads changed) and what
    follows them; x-if keys the oracle run does not read re-run nothing."""
    if stages & set(rk.TRAIN_INPUTS):
        stages = stages | {"train"}
    first = set().union(*(stage_rules(s, readers) for s in stages))
    return downstream(first, readers)


def test_editing_a_key_reruns_exactly_the_stages_that_read_it(finished):
    work, _ = finished
    assert planned_jobs(snakemake(work, "-n")) == {}
    readers = rule_graph(work)
    wrong = {}
    edits = [("guidance", k, v) for k, v in GUIDANCE.items()]
    edits += [("method", k, v) for k, v in METHOD.items()]
    assert set(GUIDANCE) == set(rk.GUIDANCE_STAGES) - {"backend"}  # backend: the unit test
    for section, key, value in edits:
        table = rk.GUIDANCE_STAGES if section == "guidance" else rk.METHOD_STAGES
        stages = set(table[key])
        if key in ("tiny_vae_path", "tiny_vae_normalize"):
            stages = set()  # the oracle teacher: no Tiny VAE (x-if)
        over = {"guidance": {key: value}}
        if section == "method":
            over = {"scene_overrides": {"hop": {key: value}}}  # merged over hop's
        extra = extra_config(work, f"edit_{key}", over)
        jobs = planned_jobs(snakemake(work, "-n", "--configfile", extra))
        expected = expected_rules(stages, readers)
        if set(jobs) != expected:
            wrong[f"{section}.{key}"] = (sorted(jobs), sorted(expected))
    assert not wrong, wrong


def test_an_evaluation_only_key_reruns_evaluate_alone(finished):
    work, _ = finished
    extra = extra_config(work, "eval_only", {"scene_overrides": {"hop": {"static_threshold": 0.5}}})
    assert set(planned_jobs(snakemake(work, "-n", "--configfile", extra))) == {
        "evaluate",
        "aggregate",
    }

"""chord.config.result_keys: the schema's ``x-stages`` is the one list of which keys change which
stage's result; each stage's config, its rule's params and the training hash are derived from
it, and each stage's code runs on its config alone (so the stage tests, which run every
stage, fail on a read of a key the stage does not declare)."""

from __future__ import annotations

import ast
import dataclasses
import pickle

import pytest

from chord.config import result_keys as rk
from chord.config import settings
from chord.plan import code_sources
from tests.conftest import REPO

SCHEMA = settings.read_schema(settings.CONFIG_SCHEMA)["properties"]
# The training's view-only keys: what a change to re-runs no training. Pinned, with the hash
# values below: the hash names checkpoint folders and is in every hand-off state.
# the view-only keys before the construction, and the evaluation's interaction threshold since
# and how often a training reports its progress and previews its motion (issue 37)
VIEW = {"ref_azim", "ref_cam_radius", "save_fps", "ex_name", "export_size", "static_threshold",
        "penetration_threshold", "progress_every_s", "preview_every"}  # fmt: skip


@pytest.mark.parametrize("section", ["method", "guidance"])
def test_every_key_names_the_stages_that_read_it_or_why_none_does(section):
    for key, spec in SCHEMA[section]["properties"].items():
        where = f"{section}.{key}"
        assert "x-stages" in spec, f"{where}: no x-stages (which stages read it?)"
        stages = spec["x-stages"]
        assert isinstance(stages, list) and len(set(stages)) == len(stages), where
        assert set(stages) <= set(rk.STAGES), f"{where}: {stages} not all in {rk.STAGES}"
        if stages:
            assert "x-neutral" not in spec, f"{where}: read by {stages}, yet x-neutral"
        else:
            assert spec.get("x-neutral"), f"{where}: no stage reads it; x-neutral must say why"
        if "x-if" in spec:
            assert section == "guidance" and spec["x-if"] in rk.CONDITIONS, where


def test_the_stages_with_a_config_are_the_workflow_stages_that_read_keys():
    # demo, viewer, sweep (its own `sweep:` rule), aggregate and the report's preview strip
    # (the training's previews, laid out) read no method or guidance key
    no_keys = ("demo", "viewer", "sweep", "aggregate", "preview_strip")
    assert rk.STAGES == tuple(s for s in code_sources.STAGES if s not in no_keys)


def test_memory_flags_are_in_no_stage_config():
    assert not set(settings.MEMORY_FLAGS) & set(rk.METHOD_STAGES)
    for stage in rk.STAGES:
        assert not set(settings.MEMORY_FLAGS) & set(rk.STAGE_KEYS[stage]), stage


def test_each_key_is_in_the_configs_of_exactly_the_stages_that_read_it():
    """A stage's config holds the keys it reads; the training's also those of the stages
    whose outputs it reads (they key its checkpoints); the preview's what the training's
    does."""
    for table, keys in ((rk.METHOD_STAGES, rk.STAGE_KEYS), (rk.GUIDANCE_STAGES, rk.GUIDANCE_KEYS)):
        for key, read_by in table.items():
            expected = set(read_by)
            if keys is rk.STAGE_KEYS and expected & {"train", *rk.TRAIN_INPUTS}:
                expected |= {"train", "preview"}
            assert {s for s in rk.STAGES if key in keys[s]} == expected, key


def test_the_training_hash_is_unchanged_by_the_construction():
    assert set(rk.VIEW_KEYS) == VIEW
    assert set(rk.STAGE_KEYS["train"]) == set(rk.METHOD_STAGES) - VIEW
    # the hashes before issue 36 turned the contact loss on, which its 0 keeps
    off = {"lambda_contact": 0.0}
    method, guidance = settings.method_from_mapping(off), settings.guidance_from_mapping({})
    assert rk.training_hash(method, guidance) == "8740ef82f8fae857"
    tiny = settings.method_from_mapping({**off, "use_tiny_vae": True})
    wan = settings.guidance_from_mapping(
        {"backend": "wan", "ckpt_dir": "/w", "tiny_vae_path": "/t"}
    )
    assert rk.training_hash(tiny, wan) == "e8bca3b708c79b76"
    assert rk.training_hash(tiny, wan, 4) == "8c6d2fa4851a4fc2"
    # the defaults since: the loss's weight keys the training (a new method's results)
    assert rk.training_hash(settings.method_from_mapping({}), guidance) == "98b54981694644d2"


@pytest.mark.parametrize("stage", rk.STAGES)
def test_a_stage_config_has_its_keys_only(stage):
    method = settings.method_from_mapping({})
    narrowed = rk.stage_config(method, stage)
    assert [f.name for f in dataclasses.fields(narrowed)] == list(rk.STAGE_KEYS[stage])
    unhashed = {k for k in rk.UNHASHED_AT if k in rk.STAGE_KEYS[stage]}
    params = rk.stage_params(method, stage)
    assert {k: v for k, v in dataclasses.asdict(narrowed).items() if k not in params} == {
        k: getattr(method, k) for k in unhashed if k not in params
    }
    assert rk.stage_config(narrowed, stage) is narrowed
    assert pickle.loads(pickle.dumps(narrowed)) == narrowed  # a training's ranks get it so
    other = next(k for k in rk.METHOD_STAGES if k not in rk.STAGE_KEYS[stage])
    with pytest.raises(AttributeError, match=f"'{other}' is not a key of stage {stage}'s"):
        getattr(narrowed, other)
    with pytest.raises(dataclasses.FrozenInstanceError):
        narrowed.size = "16*16"
    guidance = rk.guidance_config(settings.guidance_from_mapping({}), stage)
    assert dataclasses.asdict(guidance) == rk.guidance_params(guidance, stage)


def test_a_config_of_another_stage_is_no_config_of_this_one():
    voxelize = rk.stage_config(settings.method_from_mapping({}), "voxelize")
    with pytest.raises(AttributeError, match="'fovy' is not a key of stage voxelize's"):
        rk.stage_config(voxelize, "reference")
    with pytest.raises(ValueError, match="stage: 'viewer' is not one of"):
        rk.stage_config(voxelize, "viewer")


# the function each stage's module runs (train: both training rules' run_stage)
ENTRY = {"train": "run_stage"}


@pytest.mark.parametrize("stage", rk.STAGES)
def test_each_stage_runs_on_its_config(stage):
    """Each stage's entry point narrows what it is given before anything else: any read of
    an undeclared key by the stage or what it calls is then an AttributeError in the stage
    tests, which run every stage (and in the workflow)."""
    path = REPO / "chord/stages" / f"{stage}.py"
    name = ENTRY.get(stage, "run")
    (fn,) = [n for n in ast.parse(path.read_text()).body if getattr(n, "name", None) == name]
    body = fn.body[1:] if isinstance(fn.body[0].value, ast.Constant) else fn.body
    narrow = f"stage_config(method, {stage!r})"
    first = ast.unparse(body[0])
    assert first.startswith("method") and narrow in first, f"{path}: {name}() starts {first}"
    if rk.GUIDANCE_KEYS[stage] and stage != "train":
        assert f"guidance_config(guidance, {stage!r})" in first, first


def rule_values(method, guidance) -> dict:
    """What the rules of each stage compare (rules/common.smk): their params; the training's
    hash; the preview's hash and its own view keys."""
    values = {s: rk.stage_params(method, s) for s in rk.STAGES}
    values["condition"] = {**values["condition"], **rk.guidance_params(guidance, "condition")}
    values["train"] = rk.training_hash(method, guidance)
    values["preview"] = (values["train"], rk.stage_params(method, "preview"))
    return values


def changed_stages(before: dict, after: dict) -> set[str]:
    return {s for s in before if before[s] != after[s]}


@pytest.mark.parametrize("backend", ["wan", "oracle"])
@pytest.mark.parametrize("use_tiny_vae", [True, False])
def test_editing_a_guidance_key_changes_exactly_the_stages_that_read_it(backend, use_tiny_vae):
    """Each guidance key edited in turn: the values of exactly its x-stages change (and the
    preview's with the training's). The Tiny VAE's weights and normalisation (once missing
    from the hash) change the Wan teacher's training where the method uses the Tiny VAE,
    nothing elsewhere; the non-finite-step policy changes nothing."""
    props = SCHEMA["guidance"]["properties"]
    base = {"backend": backend, "ckpt_dir": "/models/wan", "tiny_vae_path": "/models/t.pth"}
    edits = {
        "backend": "oracle" if backend == "wan" else "wan",
        "ckpt_dir": "/models/other",
        "tiny_vae_path": "/models/other.pth",
        "tiny_vae_normalize": not props["tiny_vae_normalize"]["default"],
        "oracle_pool": 4,
        "oracle_gain": 2.5,
        "max_nonfinite_steps": 9,
        "nonfinite_fallback": "none",
    }
    assert set(edits) == set(props)  # a new guidance key needs a line here
    method = settings.method_from_mapping({"use_tiny_vae": use_tiny_vae})
    before = rule_values(method, settings.guidance_from_mapping(base))
    for key, value in edits.items():
        after = rule_values(method, settings.guidance_from_mapping({**base, key: value}))
        expected = set(props[key]["x-stages"])
        if props[key].get("x-if") == "tiny_vae" and not (backend == "wan" and use_tiny_vae):
            expected = set()
        if "train" in expected:
            expected.add("preview")
        assert changed_stages(before, after) == expected, key
    tiny = {"tiny_vae_path", "tiny_vae_normalize"}
    assert (tiny <= set(rk.teacher_values(method, settings.guidance_from_mapping(base)))) == (
        backend == "wan" and use_tiny_vae
    )


def test_editing_a_method_key_changes_exactly_the_stages_that_read_it():
    method, guidance = settings.method_from_mapping({}), settings.guidance_from_mapping({})
    before = rule_values(method, guidance)
    for key, read_by in rk.METHOD_STAGES.items():
        after = rule_values(dataclasses.replace(method, **{key: ["edited"]}), guidance)
        expected = set(read_by)
        if expected & {"train", *rk.TRAIN_INPUTS}:
            expected |= {"train", "preview"}
        assert changed_stages(before, after) == expected, key


def test_a_key_added_after_the_hash_is_left_out_of_it_at_its_old_behaviours_value():
    """x-unhashed-at keys (issue 36's contact terms): at the value with which they train what the
    code before them trained, the params and the hash are those made before the keys existed
    (the pin below is the hash of the defaults before issue 36); any other value keys the
    training, the default included."""
    assert rk.UNHASHED_AT == {
        "lambda_contact": 0.0,
        "lambda_support": 0.0,
        "contact_landmarks": [1, 1, 1, 1, 1],
    }
    guidance = settings.guidance_from_mapping({})
    old = settings.method_from_mapping({"lambda_contact": 0, "lambda_support": 0.0})
    assert rk.training_hash(old, guidance) == "8740ef82f8fae857"
    assert not set(rk.UNHASHED_AT) & set(rk.stage_params(old, "train"))
    assert list(rk.stage_config(old, "train").contact_landmarks) == [1] * 5  # the trainer reads it
    for key, value in [("lambda_contact", 1000.0), ("lambda_support", 1.0)]:
        on = settings.method_from_mapping({key: value})
        assert rk.stage_params(on, "train")[key] == value
        assert rk.training_hash(on, guidance) != rk.training_hash(old, guidance)
    ramp = settings.method_from_mapping({"lambda_contact": 0, "contact_landmarks": [0, 1, 1, 1, 1]})
    assert list(rk.stage_params(ramp, "train")["contact_landmarks"]) == [0, 1, 1, 1, 1]


def test_values_hash_is_stable():
    assert rk.values_hash({"a": 1, "b": [1, 2]}) == rk.values_hash({"b": [1, 2], "a": 1})
    assert rk.values_hash({"a": 1}) != rk.values_hash({"a": 2})

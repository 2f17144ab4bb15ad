"""Which configuration keys change each stage's result, by construction (issue 23).

The schema is the one source: every ``method`` and ``guidance`` key of
``schemas/config.schema.yaml`` names in ``x-stages`` the stages whose code reads it (a key that
no stage reads says why in ``x-neutral``). From it come, for each stage:

- its narrowed config (:func:`stage_config`, :func:`guidance_config`): a frozen dataclass of
  exactly its keys, which the stage's ``run()`` works on; reading any other key is an
  AttributeError naming the stage and the schema, so a stage cannot read a key that is not in
  its config;
- its rule's ``params`` (:func:`stage_params`): that config's fields, so a key that changes the
  result cannot be left out, and one that does not (memory flags: no method key at all; the
  view-only keys of the training) is not in it;
- for the training, the hash that names its checkpoint folder and is its rules' params
  (:func:`training_hash`): the train config's fields and the teacher's guidance fields.

Torch-free and computed once at import: ``rules/common.smk`` imports it at every Snakemake
start.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any

from chord.config import settings

# The stages that read method or guidance keys, in DAG order: chord.plan.code_sources.STAGES (each
# chord.stages.<stage>; train: train_coarse and train_fine, preview: teacher_preview) but demo,
# viewer and aggregate, which read none.
_NAMES = "ingest gaussians voxelize reference condition train export evaluate preview"
STAGES = tuple(_NAMES.split())
# The stages whose outputs a training reads: their keys key its checkpoints too, so a resume
# never continues a checkpoint made from other inputs.
TRAIN_INPUTS = ("ingest", "gaussians", "voxelize", "condition")
# x-if: a guidance key read only where this holds of the scene's method and the guidance.
CONDITIONS: dict[str, Callable[[Any, Any], bool]] = {
    # the Wan teacher encodes with the Tiny VAE only where the method asks for it
    "tiny_vae": lambda method, guidance: guidance.backend == "wan" and method.use_tiny_vae,
}


def schema_stages(section: str) -> dict[str, tuple[str, ...]]:
    """``{key: x-stages}`` of the schema's ``method`` or ``guidance`` section."""
    props = settings.read_schema(settings.CONFIG_SCHEMA)["properties"][section]["properties"]
    return {key: tuple(spec.get("x-stages", ())) for key, spec in props.items()}


METHOD_STAGES = schema_stages("method")
GUIDANCE_STAGES = schema_stages("guidance")


def _own(table: dict[str, tuple[str, ...]], *stages: str) -> tuple[str, ...]:
    return tuple(key for key, read_by in table.items() if set(stages) & set(read_by))


#: each stage's method keys: those it reads; the training's also those of its input stages
STAGE_KEYS: dict[str, tuple[str, ...]] = {s: _own(METHOD_STAGES, s) for s in STAGES}
STAGE_KEYS["train"] = _own(METHOD_STAGES, "train", *TRAIN_INPUTS)
# the teacher preview samples what the training distils from, seen from the reference view
STAGE_KEYS["preview"] = _own(METHOD_STAGES, "train", *TRAIN_INPUTS, "preview")
#: each stage's guidance keys
GUIDANCE_KEYS: dict[str, tuple[str, ...]] = {s: _own(GUIDANCE_STAGES, s) for s in STAGES}
#: the method keys a training's result does not depend on (read by the reference view, export,
#: evaluation and naming only): a change to one must not re-run hours of training
VIEW_KEYS = tuple(k for k in METHOD_STAGES if k not in STAGE_KEYS["train"])
_IF = {
    key: spec["x-if"]
    for key, spec in settings.read_schema(settings.CONFIG_SCHEMA)["properties"]["guidance"][
        "properties"
    ].items()
    if "x-if" in spec
}


def _missing(self, name: str):
    """A stage's config has no such key: name the stage and where its keys come from."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"{type(self).__name__}: {name!r} is not a key of stage {self.stage}'s config; "
        f"list {self.stage} in its x-stages in chord/config/schemas/config.schema.yaml if the "
        "stage reads it (then it is also in the rule's params)"
    )


# The narrowed classes are made on first use, not at import: the DAG build imports this module
# and needs none of them (a 90-field dataclass takes tens of milliseconds to make).
_CLASSES = {
    f"{stage.capitalize()}{kind}": (kind, stage)
    for kind in ("Method", "Guidance")
    for stage in STAGES
}


@functools.cache
def _narrowed(kind: str, stage: str) -> type:
    keys = (STAGE_KEYS if kind == "Method" else GUIDANCE_KEYS)[stage]
    cls = dataclasses.make_dataclass(
        f"{stage.capitalize()}{kind}",
        [(key, Any) for key in keys],
        frozen=True,
        namespace={"__module__": __name__, "__getattr__": _missing, "stage": stage},
    )
    cls.__doc__ = f"The {kind.lower()} keys that stage {stage} reads (x-stages), no other."
    return cls


def __getattr__(name: str) -> type:
    """The narrowed classes by name (``TrainMethod``...), as pickle finds them."""
    if name in _CLASSES:
        return _narrowed(*_CLASSES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _narrow(kind: str, values, stage: str):
    if stage not in STAGES:
        raise ValueError(f"stage: {stage!r} is not one of {STAGES}")
    cls = _narrowed(kind, stage)
    if isinstance(values, cls):
        return values
    return cls(**{key: getattr(values, key) for key in cls.__dataclass_fields__})


def stage_config(method: Any, stage: str) -> Any:
    """``method`` (a MethodConfig, or this stage's config already) narrowed to the keys
    ``stage`` reads: a frozen dataclass whose other attributes raise AttributeError."""
    return _narrow("Method", method, stage)


def guidance_config(guidance: Any, stage: str) -> Any:
    """``guidance`` narrowed to the keys ``stage`` reads, as :func:`stage_config`."""
    return _narrow("Guidance", guidance, stage)


#: method keys added after results were keyed by these params (``x-unhashed-at`` in the
#: schema) and the value at which each trains what the code before it trained: at that value
#: such a key is left out of the params and so of the training hash, which then equal those made
#: before it existed (a run that does not use it re-runs nothing); any other value, its default
#: included, is in them like any other key's
UNHASHED_AT: dict[str, Any] = {
    key: spec["x-unhashed-at"]
    for key, spec in settings.read_schema(settings.CONFIG_SCHEMA)["properties"]["method"][
        "properties"
    ].items()
    if "x-unhashed-at" in spec
}


def _numbers(value: Any) -> Any:
    """A number or list of numbers as floats, so that 1 equals 1.0 and a tuple its list (any
    other value as it is)."""
    try:
        return [float(x) for x in value] if isinstance(value, (list, tuple)) else float(value)
    except (TypeError, ValueError):
        return value


def _unhashed(method: Any, key: str) -> bool:
    return key in UNHASHED_AT and _numbers(getattr(method, key)) == _numbers(UNHASHED_AT[key])


def stage_params(method: Any, stage: str) -> dict:
    """The method values that change ``stage``'s result: its config's fields (the rule's
    ``params:``), but an ``x-unhashed-at`` key at that value (:data:`UNHASHED_AT`)."""
    return {key: getattr(method, key) for key in STAGE_KEYS[stage] if not _unhashed(method, key)}


def guidance_params(guidance: Any, stage: str) -> dict:
    """The guidance values that change ``stage``'s result: its guidance config's fields."""
    return {key: getattr(guidance, key) for key in GUIDANCE_KEYS[stage]}


def values_hash(values: dict) -> str:
    """A stable hash of result-changing configuration values (JSON, sorted keys)."""
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def training_hash(method: Any, guidance: Any, world_size: int = 1) -> str:
    """Hash of everything that changes a training's result: its config's fields (those of the
    method that the training and its input stages read; memory flags are no method key, the
    view-only keys are not read) and the teacher's (:func:`teacher_values`). It names the
    checkpoint folder and is the training rules' ``params``. Torch-free, so the workflow's DAG
    build does not import torch.

    ``world_size``: the ranks that each train ``method.batch_size`` videos (METHOD §18). They
    train what one process with ``world_size`` times that batch trains, so they hash as it
    does: a multi-GPU tier's ranks (``batch_size`` / gpus each) share the scene's checkpoints
    and hand-off with its single-GPU tiers."""
    values = stage_params(method, "train")
    values["batch_size"] = method.batch_size * int(world_size)
    values["guidance"] = teacher_values(method, guidance)
    return values_hash(values)


def teacher_values(method: Any, guidance: Any) -> dict:
    """The guidance values that change a training's teacher: its guidance config's fields,
    each ``x-if`` one only where its condition holds (the Wan teacher's Tiny VAE weights and
    normalisation where the method encodes with it). Keys no stage reads (the non-finite-step
    policy: how a run recovers, not what it distils) are in no config."""
    return {
        key: getattr(guidance, key)
        for key in GUIDANCE_KEYS["train"]
        if key not in _IF or CONDITIONS[_IF[key]](method, guidance)
    }

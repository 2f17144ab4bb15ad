"""The configuration's schemas (``schemas/*.yaml``, the single source of truth for every key,
type and default) and their validation with defaults: what the settings
(:mod:`chord.config.settings`)
and the scene sheet (:mod:`chord.config.sheet`) both check against."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import yaml

from chord.core.errors import InputError

SCHEMA_DIR = Path(__file__).parent / "schemas"
CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"
SCENES_SCHEMA = SCHEMA_DIR / "scenes.schema.yaml"


class ConfigError(InputError):
    """A configuration or scene-sheet value is invalid; the message names where and why."""


# libyaml's loader where PyYAML was built with it: every process that imports the settings
# (each Snakemake start, each job) parses the 30 kB config schema, 8x faster than in Python
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def read_schema(path: Path) -> dict:
    """The parsed schema at ``path``, read once per process (shared: treat it as read-only)."""
    with open(path) as f:
        return yaml.load(f, Loader=_LOADER)


@functools.cache
def _with_defaults(validator_class):
    """A validator that fills ``default`` values in place, as ``snakemake.utils.validate`` does."""
    validate_props = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _path_of(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def validate(instance: dict, schema: dict, *, where: str, set_default: bool = True) -> dict:
    """Validate ``instance`` against ``schema`` (filling defaults); raise ConfigError naming
    ``where``, the key path and what is wrong."""
    cls = jsonschema.validators.validator_for(schema)
    if set_default:
        cls = _with_defaults(cls)
    errors = sorted(cls(schema).iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{where}: {_path_of(e)}: {e.message}" for e in errors[:10]]
        raise ConfigError("invalid configuration\n  " + "\n  ".join(lines))
    return instance


def few(names, n: int = 5) -> str:
    """At most ``n`` names for an error message, e.g. "a, b, c, d, e (+995 more)"."""
    names = list(names)
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(str(x) for x in names[:n]) + more

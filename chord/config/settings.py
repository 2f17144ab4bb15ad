"""Configuration: schema validation with defaults, then typed, frozen objects.

The JSON schemas in ``chord/config/schemas/`` are the single source of truth for every key, type and
default (METHOD.md's defaults under ``method:``). Snakemake validates the same files at
workflow start; the ``chord`` CLI and the stages call :func:`load` here. Code below this edge
never sees a raw dict. The scene sheet is read in :mod:`chord.config.sheet`; which keys change which
stage's result (its narrowed config, its rule's params, the training hash) is
:mod:`chord.config.result_keys`, from the schema's ``x-stages``.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chord.config.schema import (  # noqa: F401 (the names settings' users reach)
    CONFIG_SCHEMA,
    SCENES_SCHEMA,
    SCHEMA_DIR,
    ConfigError,
    few,
    read_schema,
    validate,
)
from chord.config.sheet import read_sheet, sheet_seeds, validate_sheet


def method_schema() -> dict:
    return read_schema(CONFIG_SCHEMA)["properties"]["method"]


def memory_schema() -> dict:
    return read_schema(CONFIG_SCHEMA)["properties"]["memory"]


# Frozen dataclasses whose fields are exactly the schema's keys (no second copy of the names or
# defaults: values always come from a validated, defaulted mapping).
MethodConfig = dataclasses.make_dataclass(
    "MethodConfig",
    [(name, Any) for name in method_schema()["properties"]],
    frozen=True,
    namespace={"__module__": __name__},  # picklable (a training's ranks get it by pickle)
)
MethodConfig.__doc__ = (
    "CHORD method parameters (METHOD.md), keyed by the release's flag names: everything that "
    "changes a result."
)
MemoryConfig = dataclasses.make_dataclass(
    "MemoryConfig",
    [(name, Any) for name in memory_schema()["properties"]],
    frozen=True,
    namespace={"__module__": __name__},
)
MemoryConfig.__doc__ = (
    "Memory flags (METHOD §15, CHORD's names): they change memory and time, never the result. "
    "Never part of the method: a training's hash, rule params and checkpoints ignore them."
)
#: the memory flags' names: the one list (the schema's `memory` section)
MEMORY_FLAGS = tuple(f.name for f in dataclasses.fields(MemoryConfig))


def method_from_mapping(values: dict, *, where: str = "method") -> Any:
    """Validate a (partial) method mapping, fill defaults and check cross-field rules."""
    schema = read_schema(CONFIG_SCHEMA)
    sub = {"$defs": schema["$defs"], **schema["properties"]["method"]}
    values = validate(copy.deepcopy(values), sub, where=where)
    _check_method(values, where)
    return MethodConfig(**values)


def memory_from_mapping(values: dict, *, where: str = "memory") -> Any:
    """Validate a (partial) memory-flag mapping and fill the defaults -> MemoryConfig."""
    return MemoryConfig(**validate(copy.deepcopy(values), memory_schema(), where=where))


def check_memory_flags(values: dict, *, where: str) -> dict:
    """Validate memory flags without filling defaults (a tier's partial set)."""
    return validate(copy.deepcopy(values), memory_schema(), where=where, set_default=False)


def guidance_from_mapping(values: dict, *, where: str = "guidance") -> GuidanceConfig:
    """Validate a (partial) guidance mapping with the schema's defaults."""
    sub = read_schema(CONFIG_SCHEMA)["properties"]["guidance"]
    return GuidanceConfig(**validate(copy.deepcopy(values), sub, where=where))


def _check_method(m: dict, where: str) -> None:
    t = m["frame_num"]
    if (t - 1) % 4 != 0:
        raise ConfigError(f"{where}: frame_num: {t} is not 4k+1 (both VAEs need (T-1) mod 4 = 0)")
    w, h = parse_size(m["size"], where=f"{where}: size")
    del w, h
    for key in ("azim_segments", "elev_segments"):
        if len(m[key]) % 2:
            raise ConfigError(f"{where}: {key}: needs [start end] pairs, got {len(m[key])} values")


def parse_size(size: str, *, where: str = "size") -> tuple[int, int]:
    """METHOD §9: "W*H" or "WxH", each a positive multiple of 16 -> (W, H)."""
    match = re.fullmatch(r"(\d+)[*x](\d+)", str(size))
    if not match:
        raise ConfigError(f"{where}: {size!r} is not 'W*H' (e.g. '832*480')")
    w, h = int(match[1]), int(match[2])
    if w % 16 or h % 16 or w == 0 or h == 0:
        near = sorted({f"{a}*{b}" for a in _multiples_near(w) for b in _multiples_near(h)})
        raise ConfigError(
            f"{where}: {size!r}: width and height must be positive multiples of 16; "
            f"nearest valid sizes: {', '.join(near)}"
        )
    return w, h


def _multiples_near(x: int) -> list[int]:
    lo = max(16, x // 16 * 16)
    return [lo] if lo == x else [lo, lo + 16] if lo < x else [lo]


@dataclass(frozen=True)
class GuidanceConfig:
    backend: str
    ckpt_dir: str | None
    tiny_vae_path: str | None
    tiny_vae_normalize: bool
    oracle_pool: int
    oracle_gain: float = 1.0
    max_nonfinite_steps: int = 5
    nonfinite_fallback: str = "float32"


@dataclass(frozen=True)
class PreviewConfig:
    """The teacher preview's sampling settings (``preview:``)."""

    steps: int = 8
    guidance_scale: float = 3.5
    guidance_scale_2: float | None = None
    boundary_ratio: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class LoggingConfig:
    """Where a training reports besides its log (``logging:``)."""

    tensorboard: bool = False


@dataclass(frozen=True)
class SceneSpec:
    """One row of the scene sheet with its effective method parameters."""

    scene: str
    data: Path
    prompt: str
    n_prompt: str
    gaussians: Path | None
    tier: str
    method: Any  # MethodConfig
    where: str = "the scene sheet"  # "scene sheet <file>, line <n>", for messages
    seeds: tuple[int, ...] = ()  # a seed sweep's seeds; () = one run with method.seed


@dataclass(frozen=True)
class SweepConfig:
    """How a seed sweep picks its best seed (``sweep:``; the seeds are each scene's)."""

    seeds: tuple[int, ...] = ()
    metric: str = "penetration_excess"
    mode: str = "min"
    require_moved: bool = True


@dataclass(frozen=True)
class Config:
    scenes: dict[str, SceneSpec]
    results: Path
    demo_dir: Path
    guidance: GuidanceConfig
    memory: Any = None  # MemoryConfig: the flags a tier leaves unset
    tiers: dict[str, dict] = field(default_factory=dict)
    render_backend: str = "auto"
    auto_lowres: bool = False
    gpu_mem_gb: float | None = None
    gpus_per_node: int | None = None
    preview: PreviewConfig = field(default_factory=PreviewConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


def check_guidance(guidance: GuidanceConfig, methods: dict, *, flags: bool = False) -> None:
    """What the Wan teacher needs, checked before any job starts: ``guidance.ckpt_dir``, and
    ``guidance.tiny_vae_path`` wherever a method (``methods``: {where: method}) sets
    ``use_tiny_vae``. ``flags``: name ``chord train``'s flags instead of the config keys."""
    if guidance.backend != "wan":
        return
    ckpt, tiny = (
        ("--ckpt_dir", "--tiny_vae_path")
        if flags
        else (
            "guidance.ckpt_dir",
            "guidance.tiny_vae_path",
        )
    )
    if not guidance.ckpt_dir:
        raise ConfigError(
            f"{ckpt}: the wan teacher needs the Wan2.2-I2V-A14B-Diffusers folder; it is not set"
        )
    if guidance.tiny_vae_path:
        return
    users = [where for where, m in methods.items() if m.use_tiny_vae]
    if users:
        flag = "--use_tiny_vae" if flags else "method.use_tiny_vae"
        raise ConfigError(
            f"{tiny}: not set, but {flag} is on ({', '.join(users[:5])}); point it at the "
            "Tiny VAE weights (lighttaew2_1.pth), or turn use_tiny_vae off (the full Wan VAE "
            "then backpropagates: far more GPU memory, see docs/wan-teacher.md)"
        )


def validate_config(config: dict) -> dict:
    """Validate the workflow config mapping in place (defaults filled)."""
    return validate(config, read_schema(CONFIG_SCHEMA), where="config")


def load(config: dict, *, base: Path | None = None) -> Config:
    """Validate a workflow config mapping and its scene sheet; return typed objects.

    A scene's method is ``method``, then the sheet row's ``preset`` (a name in ``presets``),
    then its ``scene_overrides`` entry, each over the one before. ``base`` resolves relative
    paths (default: the current directory, as Snakemake does).
    """

    config = validate_config(copy.deepcopy(config))
    base = Path(base or ".")
    sheet_path = base / config["scenes"]
    rows = validate_sheet(read_sheet(sheet_path), path=config["scenes"])
    names = [r["scene"] for r in rows]
    unknown = sorted(set(config["scene_overrides"]) - set(names))
    if unknown:
        raise ConfigError(
            f"config: scene_overrides: unknown scene(s) {few(unknown)}; the sheet "
            f"{config['scenes']} has {few(names)}"
        )
    presets = config["presets"]
    tiers = config["tiers"]
    sweep = SweepConfig(**{**config["sweep"], "seeds": tuple(config["sweep"]["seeds"])})
    scenes = {}
    shared = {}  # preset -> its validated method: scenes without overrides share it
    for row in rows:
        name = row["scene"]
        preset = row.get("preset")
        if preset is not None and preset not in presets:
            raise ConfigError(
                f"scene sheet {config['scenes']}, line {row['_line']}: scene {name!r}: preset "
                f"{preset!r} is not one of the config's presets [{few(presets)}]"
            )
        over = config["scene_overrides"].get(name, {})
        if over or preset not in shared:
            where = "config: method" if preset is None else f"config: presets.{preset}"
            method = method_from_mapping(
                {**config["method"], **(presets[preset] if preset else {}), **over},
                where=f"config: scene_overrides.{name}" if over else where,
            )
            if not over:
                shared[preset] = method
        else:
            method = shared[preset]
        tier = row.get("tier") or "auto"
        if tier != "auto" and tier not in tiers:
            raise ConfigError(
                f"scene sheet {config['scenes']}: scene {name!r}: tier {tier!r} is not one of "
                f"{['auto', *tiers]}"
            )
        n_prompt = row.get("n_prompt")
        where = f"scene sheet {config['scenes']}, line {row['_line']}"
        seeds = sweep.seeds
        if row.get("seeds") is not None:
            seeds = sheet_seeds(row["seeds"], where=f"{where}: scene {name!r}: seeds")
        scenes[name] = SceneSpec(
            scene=name,
            data=base / row["data"],
            prompt=row["prompt"],
            n_prompt=method.n_prompt if n_prompt is None else n_prompt,
            gaussians=None if row.get("gaussians") is None else base / row["gaussians"],
            tier=tier,
            method=method,
            where=where,
            seeds=seeds,
        )
    guidance = GuidanceConfig(**config["guidance"])
    check_guidance(guidance, {f"scene {n}": s.method for n, s in scenes.items()})
    return Config(
        scenes=scenes,
        results=base / config["results"],
        demo_dir=base / config["demo_dir"],
        guidance=guidance,
        memory=MemoryConfig(**config["memory"]),
        tiers=tiers,
        render_backend=config["render_backend"],
        auto_lowres=config["auto_lowres"],
        gpu_mem_gb=config["gpu_mem_gb"],
        gpus_per_node=config["gpus_per_node"],
        preview=PreviewConfig(**config["preview"]),
        sweep=sweep,
        logging=LoggingConfig(**config["logging"]),
    )


def read_yaml(path: Path) -> dict:
    """A YAML config file's mapping; a missing or malformed file is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    with open(path) as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    return data


def merge(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` key by key, nested mappings recursively: what Snakemake
    does with each --configfile over the Snakefile's configfile."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_file(path: Path, *over: Path) -> Config:
    """Load ``config.yaml``, with each file of ``over`` merged over it as the workflow merges
    --configfile (relative paths resolve against the current directory)."""
    data = read_yaml(path)
    for extra in over:
        data = merge(data, read_yaml(extra))
    return load(data)


def final_stage(method: Any) -> str:
    """The training stage whose state is the result: fine with a second layer, else coarse
    (which then runs every iteration)."""
    return "fine" if method.add_cp_objs else "coarse"


def scene_roles(method: Any, n: int) -> dict[str, str]:
    """METHOD §1 roles for ids 0..n-1: 'static', 'dynamic' or 'avoided' (what ingest reads:
    ``static_id``, ``additional_static_objs`` and ``avoid_objs``, each checked against ``n``)."""
    if not 0 <= method.static_id < n:
        raise ConfigError(f"method: static_id: {method.static_id} is outside [0, {n}) objects")
    _check_objects(method, n, ("additional_static_objs", "avoid_objs"))
    roles = {}
    for i in range(n):
        name = f"obj_{i}"
        if name in method.avoid_objs:
            roles[name] = "avoided"
        elif i == method.static_id or name in method.additional_static_objs:
            roles[name] = "static"
        else:
            roles[name] = "dynamic"
    return roles


def object_roles(method: Any, n: int) -> dict[str, str]:
    """:func:`scene_roles`, with every object list of the method checked against them (the
    plan's check, before any job starts)."""
    roles = scene_roles(method, n)
    _check_objects(method, n, ("add_cp_objs", "cp_surface_only_objs", "gl_objects"))
    for name in method.add_cp_objs:
        if roles[name] != "dynamic":
            raise ConfigError(f"method: add_cp_objs: {name} is {roles[name]}, not dynamic")
    return roles


def _check_objects(method: Any, n: int, keys: tuple[str, ...]) -> None:
    for key in keys:
        for name in getattr(method, key):
            if int(name.split("_")[1]) >= n:
                raise ConfigError(
                    f"method: {key}: {name} does not exist (the scene has {n} objects)"
                )

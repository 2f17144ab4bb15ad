"""The scene sheet (``config/scenes.tsv``): one row per scene with its data folder, prompt and
per-scene overrides, read as strings and validated against ``schemas/scenes.schema.yaml``
(file and line in every message). :func:`chord.config.settings.load` turns the rows into
SceneSpecs."""

from __future__ import annotations

import re
from pathlib import Path

from chord.config.schema import SCENES_SCHEMA, ConfigError, few, read_schema, validate

SCENE_ID = re.compile(r"^[A-Za-z0-9_-]+$")

# The sheet's columns: the first three are required, the others optional (empty = None).
SHEET_COLUMNS = ("scene", "data", "prompt", "n_prompt", "gaussians", "tier", "preset", "seeds")


def read_sheet(path: Path) -> list[dict]:
    """Read the scene sheet (TSV): every cell a string, empty optional cells as None."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"scene sheet {path}: file not found")
    try:
        df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, comment="#")
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ConfigError(f"scene sheet {path}: not a readable TSV ({exc})") from exc
    df.columns = [c.strip() for c in df.columns]
    rows = []
    for i, rec in enumerate(df.to_dict("records"), start=2):  # line 1 is the header
        row = {k: (v.strip() if isinstance(v, str) else v) for k, v in rec.items()}
        for key in SHEET_COLUMNS[3:]:
            if row.get(key) == "":
                row[key] = None
        row["_line"] = i
        rows.append(row)
    return rows


def validate_sheet(rows: list[dict], *, path: Path | str = "scenes.tsv") -> list[dict]:
    """Validate each row against the sheet schema; scene ids unique and path-safe."""
    schema = read_schema(SCENES_SCHEMA)
    seen: dict[str, int] = {}
    for row in rows:
        line = row.get("_line", "?")
        clean = {k: v for k, v in row.items() if k != "_line"}
        if clean.get("prompt") in (None, ""):
            name = clean.get("scene", "?")
            raise ConfigError(f"scene sheet {path}, line {line}: scene {name!r}: prompt is missing")
        validate(clean, schema, where=f"scene sheet {path}, line {line}", set_default=False)
        name = clean["scene"]
        if name in seen:
            raise ConfigError(
                f"scene sheet {path}, line {line}: scene {name!r} duplicates line {seen[name]}"
            )
        seen[name] = line
    return rows


def sheet_seeds(cell: str, *, where: str) -> tuple[int, ...]:
    """A row's ``seeds`` cell ("0 1 2" or "0,1,2", the schema's pattern) as seeds; a repeated
    seed is a ConfigError naming ``where``."""
    seeds = tuple(int(s) for s in re.split(r"[ ,]+", cell.strip()))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"{where}: {cell!r} repeats seed(s) {few(repeated)}")
    return seeds

"""Seed sweeps: which seed of a scene the config's rule chooses, from each seed's metrics.json
(``sweep: {metric, mode, require_moved}``). Torch-free; the stage that draws the comparison
is :mod:`chord.stages.sweep`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from chord.core.errors import InputError

MOVED_KEY = "static_warning"  # metrics.json: true when the dynamic objects barely moved


@dataclass(frozen=True)
class Choice:
    """The chosen seed, the value it was chosen by, and why."""

    seed: int
    value: float
    values: dict[int, float | None]  # every seed's value of the metric (None: n/a)
    moved: dict[int, bool]  # every seed: whether it moved (no static_warning)
    reason: str


def metric_value(doc: Mapping, metric: str, where: Path | str) -> float | None:
    """``doc[metric]`` as a float; None where the run has no value (null, NaN). A missing
    key or a value that is not a number is an InputError naming the file and the key."""
    if metric not in doc:
        numeric = sorted(k for k, v in doc.items() if isinstance(v, int | float))
        raise InputError(
            f"{where}: sweep.metric: {metric!r} is not a metric of this file; numeric metrics: "
            f"{', '.join(numeric)}"
        )
    value = doc[metric]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: sweep.metric: {metric!r} is {value!r}, not a number")
    return None if math.isnan(value) else float(value)


def choose(
    docs: Mapping[int, Mapping],
    *,
    metric: str,
    mode: str,
    require_moved: bool,
    where: Mapping[int, Path | str] | None = None,
) -> Choice:
    """The seed of ``docs`` ({seed: metrics.json}) with the least (``mode`` min) or most
    (max) ``metric``, among the seeds that moved when ``require_moved`` (all of them, said so
    in the reason, when none moved); a tie goes to the lowest seed. Seeds without a value are
    never chosen; none with one is an InputError."""
    if mode not in ("min", "max"):
        raise ValueError(f"sweep.mode: {mode!r} is not min or max")
    where = where or {s: f"seed {s}" for s in docs}
    values = {s: metric_value(doc, metric, where[s]) for s, doc in sorted(docs.items())}
    moved = {s: not bool(doc.get(MOVED_KEY, False)) for s, doc in sorted(docs.items())}
    valued = [s for s, v in values.items() if v is not None]
    if not valued:
        raise InputError(
            f"sweep: no seed has a value of {metric!r} ({', '.join(map(str, where.values()))})"
        )
    pool, note = valued, ""
    if require_moved:
        pool = [s for s in valued if moved[s]]
        if not pool:
            pool, note = valued, "; none of the seeds moved (static_warning), so among all"
        else:
            still = [s for s in valued if not moved[s]]
            note = f"; seeds {still} did not move and were left out" if still else ""
    sign = 1.0 if mode == "min" else -1.0
    best = min(pool, key=lambda s: (sign * values[s], s))
    word = "least" if mode == "min" else "most"
    reason = f"the {word} {metric} ({values[best]:.6g}) of seeds {pool}{note}"
    return Choice(seed=best, value=values[best], values=values, moved=moved, reason=reason)

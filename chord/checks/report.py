"""A check's row (:class:`Check`: pass, fail with the remedy, or n/a with why), the table the
preflight and ``chord doctor`` print, and the error a failed preflight raises."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from chord.core.errors import InputError

PASS, FAIL, NA = "pass", "fail", "n/a"


@dataclass(frozen=True)
class Check:
    """One row of the table; ``fatal``: a failure a training must not start with."""

    name: str
    status: str
    detail: str
    remedy: str = ""
    fatal: bool = True


class PreflightError(InputError):
    """A training's preflight failed (exit 2); the message holds every failing row."""


def table(checks: Iterable[Check]) -> str:
    """The checks as one aligned text table (remedies on the line below a failure)."""
    checks = list(checks)
    width = max((len(c.name) for c in checks), default=5)
    lines = [f"{'check':<{width}}  status  detail"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.status:<6}  {c.detail}")
        if c.status == FAIL and c.remedy:
            lines.append(f"{'':<{width}}  {'':<6}  fix: {c.remedy}")
    return "\n".join(lines)


def failures(checks: Iterable[Check], *, fatal_only: bool = False) -> list[Check]:
    return [c for c in checks if c.status == FAIL and (c.fatal or not fatal_only)]

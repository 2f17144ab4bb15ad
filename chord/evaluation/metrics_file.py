"""The metrics.json format (``chord-metrics/1``, docs/outputs.md): what evaluate writes, and
aggregate and the seed sweep read back."""

from __future__ import annotations

from pathlib import Path

from chord.core.atomic_files import read_json
from chord.core.errors import InputError

FORMAT = "chord-metrics/1"


def read(path: Path) -> dict:
    """A metrics.json; an unreadable file or another format is an InputError naming it."""
    try:
        doc = read_json(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable metrics ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{path}: not a {FORMAT} file")
    return doc


def scalars(doc: dict) -> dict:
    """The one-number entries of a metrics document (no per-frame curves, no format tag)."""
    return {k: v for k, v in doc.items() if not isinstance(v, dict | list) and k != "format"}

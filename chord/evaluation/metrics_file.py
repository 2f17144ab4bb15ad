"""The metrics.json format (``chord-metrics/1``, docs/outputs.md): what evaluate writes, and
aggregate and the seed sweep read back."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from chord.core.atomic_files import read_json
from chord.core.errors import InputError

FORMAT = "chord-metrics/1"


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read(path: Path, numbers: Iterable[str] = ()) -> dict:
    """A metrics.json; an InputError of one line naming it where it cannot be read, is cut
    short, is of another format, or has an entry its readers compute with of another type:
    each of ``numbers`` (what the caller plots or compares) a number or null, each
    ``*_warning`` flag a boolean (the file is written by another job, maybe another
    version, on a file system that may fill up)."""
    try:
        doc = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: cut short, not UTF-8
        why = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise InputError(f"{path}: unreadable metrics ({why})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{path}: not a {FORMAT} file")
    wrong = [f"{k} is {v!r:.40}, not a number" for k in numbers
             if (v := doc.get(k)) is not None and not _is_number(v)]  # fmt: skip
    wrong += [f"{k} is {v!r:.40}, not true or false" for k, v in doc.items()
              if k.endswith("_warning") and not isinstance(v, bool)]  # fmt: skip
    if wrong:
        raise InputError(f"{path}: damaged metrics: {'; '.join(wrong)}")
    return doc


def scalars(doc: dict) -> dict:
    """The one-number entries of a metrics document (no per-frame curves, no format tag)."""
    return {k: v for k, v in doc.items() if not isinstance(v, dict | list) and k != "format"}

"""Where a glTF's buffer and image URIs may point: a ``.gltf`` is untrusted input, so its
URIs are relative references to files inside the scene's folder (percent-decoded, ``..``
resolved, symlinks followed), or ``data:`` URIs; an absolute path, a path leading out of the
folder (``../elsewhere/x.bin``, or a link to a file outside it) and any other scheme
(``file:``, ``http:``, ...) are refused, naming the file, the URI and this rule, before any
file is opened. What the reader (:mod:`chord.gltf.reader`) and the workflow's inputs
(:func:`chord.gltf.reader.external_files`) both follow."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from chord.core.errors import InputError

RULE = (
    "buffer and image URIs must be relative paths to files inside the scene's folder, or data: URIs"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def shown(value, limit: int = 80) -> str:
    """``value``'s repr on one line, cut to ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def is_data(uri) -> bool:
    return isinstance(uri, str) and uri[:5].lower() == "data:"


def scene_path(uri, folder: Path | str, where: str, what: str) -> Path:
    """The file the relative URI ``uri`` names inside ``folder`` (normalised, not resolved:
    a link inside the folder keeps its name); an :class:`InputError` naming ``where``,
    ``what`` (e.g. "buffer 0"), the URI and the rule otherwise. Opens nothing."""

    def refuse(why: str):
        raise InputError(f"{where}: {what} has the URI {shown(uri, 240)}, {why}; {RULE}")

    if not isinstance(uri, str):
        refuse("which is not a string")
    if m := _SCHEME.match(uri):
        refuse(f"a {m[1]}: URI, which chord does not read")
    name = unquote(uri)
    if not name or "\0" in name or name.endswith(("/", "\\")):
        refuse("which names no file")
    if os.path.isabs(name) or name.startswith("\\"):
        refuse("an absolute path")
    base = os.path.abspath(folder)
    lexical = os.path.normpath(os.path.join(base, name))
    if not _inside(lexical, base):
        refuse("which leads outside the scene's folder")
    if not _inside(os.path.realpath(lexical), os.path.realpath(base)):
        refuse("a link to a file outside the scene's folder")
    return Path(os.path.normpath(Path(folder) / name))

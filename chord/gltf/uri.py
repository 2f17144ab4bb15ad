"""Where a glTF's buffer and image URIs may point: a ``.gltf`` is untrusted input, so its
URIs are relative references to files inside the scene's folder (percent-decoded, ``..``
resolved, symlinks followed), or ``data:`` URIs; an absolute path, a path leading out of the
folder (``../elsewhere/x.bin``, or a link to a file outside it) and any other scheme
(``file:``, ``http:``, ...) are refused, naming the file, the URI and this rule, before any
file is opened. What the reader (:mod:`chord.gltf.reader`) and the workflow's inputs
(:func:`chord.gltf.reader.external_files`) both follow. A file a URI names is read by
:func:`regular_bytes`: a regular file (not a folder, a FIFO or a device, nor a link to one) of
the size its document declares, and no more of it."""

from __future__ import annotations

import os
import re
import stat
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


KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _problem(file, mode: int | None) -> str | None:
    """What keeps ``file`` (of ``mode``, None: absent) from being read as a regular file."""
    link = f"a link to {os.path.realpath(file)}" if os.path.islink(file) else ""
    if mode is None:
        return f"is {link}, which does not exist" if link else "does not exist"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in KINDS if test(mode)), "not a file")
    return f"is not a regular file ({link + ', ' if link else ''}{kind})"


def file_problem(file: Path | str) -> str | None:
    """None where ``file`` is a regular file (links followed); else what it is, in words:
    "does not exist", "is not a regular file (a FIFO)", "is not a regular file (a link to
    /dev/zero, a character device)". Opens nothing (a FIFO's open would wait)."""
    try:
        mode = os.stat(file).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return _problem(file, mode)


def regular_bytes(
    file: Path | str, refuse, *, length: int | None = None, limit: tuple[int, str] | None = None
) -> bytes:
    """The bytes of ``file``, a regular file, else ``refuse(why)`` (which raises;
    :func:`file_problem`'s words); also where it holds other than ``length`` bytes (when
    given; both named) or more than ``limit`` (bytes, and why that many: "more than ...").
    Only ``length`` bytes are read. Opened without
    blocking (a FIFO's open would wait for a writer) and checked on the open file, so what
    is checked is what is read."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        refuse(file_problem(file) or "cannot be opened")
    try:
        st = os.fstat(fd)
        if problem := _problem(file, st.st_mode):
            refuse(problem)
        if length is not None and st.st_size != length:
            refuse(f"holds {st.st_size} bytes, but its byteLength is {length}")
        if limit is not None and st.st_size > limit[0]:
            refuse(f"holds {st.st_size} bytes, {limit[1]}")
        want = st.st_size if length is None else length
        chunks, got = [], 0
        while got < want:  # one read returns at most 2 GiB on Linux
            chunk = os.read(fd, min(want - got, 1 << 30))
            if not chunk:
                refuse(f"holds {got} bytes, fewer than the {want} it held when opened")
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)

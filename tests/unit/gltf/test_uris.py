"""A .gltf's buffer and image URIs stay inside the scene's folder (chord.gltf.uri): an absolute
path, a parent escape or a scheme but data: is refused by the reader, by `chord validate`'s
reading and when the workflow's inputs are computed, in one line naming the file, the URI and
the rule, and no file outside the folder is opened (watched with an audit hook)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import pytest
import trimesh

from chord.core.errors import InputError
from chord.gltf import reader
from chord.gltf import uri as gltf_uri
from chord.scene import ingestion

OPENED: list[str] | None = None  # the paths opened while a test watches, else None


def _audit(event: str, args) -> None:
    if OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, Path)):
        OPENED.append(os.path.abspath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


@pytest.fixture
def opened():
    """The absolute paths the process opens during the test."""
    global OPENED
    OPENED = []
    try:
        yield OPENED
    finally:
        OPENED = None


def gltf_scene(root: Path) -> tuple[Path, Path]:
    """scene/obj_0.gltf (two .bin files beside it) and elsewhere/x.bin, a copy of its first
    buffer outside the scene's folder: (the .gltf, the outside file)."""
    folder = root / "scene"
    folder.mkdir(parents=True)
    path = folder / "obj_0.gltf"
    trimesh.creation.box().export(path)
    outside = root / "elsewhere" / "x.bin"
    outside.parent.mkdir()
    shutil.copy(folder / json.loads(path.read_text())["buffers"][0]["uri"], outside)
    return path, outside


def set_uri(path: Path, uri: str, key: str = "buffers") -> None:
    doc = json.loads(path.read_text())
    if key == "images":
        doc["images"] = [{"uri": uri}]
    else:
        doc["buffers"][0]["uri"] = uri
    path.write_text(json.dumps(doc))


def refusals(tmp_path: Path, outside: Path) -> dict[str, str]:
    return {
        "parent": "../elsewhere/x.bin",
        "parent_encoded": "%2E%2E/elsewhere/x.bin",
        "parent_inside_first": "sub/../../elsewhere/x.bin",
        "absolute": str(outside),
        "file_scheme": outside.as_uri(),
        "http": "http://example.com/x.bin",
        "drive": "C:/x.bin",
    }


CASES = ["parent", "parent_encoded", "parent_inside_first", "absolute", "file_scheme", "http",
         "drive"]  # fmt: skip


@pytest.mark.parametrize("key", ["buffers", "images"])
@pytest.mark.parametrize("case", CASES)
def test_a_uri_outside_the_scene_is_refused_in_one_line_without_opening_it(
    tmp_path, opened, case, key
):
    path, outside = gltf_scene(tmp_path)
    uri = refusals(tmp_path, outside)[case]
    set_uri(path, uri, key)
    opened.clear()  # the set-up wrote the outside file
    what = "buffer 0" if key == "buffers" else "image 0"
    for call in (reader.read, reader.external_files, ingestion.load_source):
        with pytest.raises(InputError) as err:
            call(path)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(f"{path}: {what} has the URI ")
        assert repr(uri) in message and gltf_uri.RULE in message
    assert not [p for p in opened if not p.startswith(str(path.parent))], opened


def test_a_link_to_a_file_outside_is_refused(tmp_path, opened):
    path, outside = gltf_scene(tmp_path)
    (path.parent / "link.bin").symlink_to(outside)
    set_uri(path, "link.bin")
    opened.clear()
    with pytest.raises(InputError, match=r"'link.bin', a link to a file outside the scene's"):
        reader.read(path)
    assert str(outside) not in opened


def test_relative_uris_inside_the_scene_are_read(tmp_path):
    path, _ = gltf_scene(tmp_path)
    first = json.loads(path.read_text())["buffers"][0]["uri"]
    want = reader.read(path).glb_bytes()
    (path.parent / "sub").mkdir()
    (path.parent / "sub" / "in.bin").symlink_to(path.parent / first)  # a link inside: allowed
    for uri in (f"sub/../{first}", f"./{first}", "sub/in.bin", f"sub/%2E%2E/{first}"):
        set_uri(path, uri)
        assert reader.read(path).glb_bytes() == want
        (found, _) = reader.external_files(path)
        assert found.resolve() == (path.parent / first).resolve()


def test_the_workflow_inputs_leave_out_an_escaping_file_and_say_so(tmp_path, caplog):
    path, outside = gltf_scene(tmp_path)
    trimesh.Scene(trimesh.creation.box()).export(path.parent / "scene.glb")
    set_uri(path, "../elsewhere/x.bin")
    with caplog.at_level(logging.WARNING, logger="chord.scene.ingestion"):
        files = ingestion.data_files(path.parent)
    assert outside not in files and all(f.parent == path.parent for f in files)
    assert path in files  # ingest still runs on it, and refuses it
    (record,) = caplog.records
    assert "'../elsewhere/x.bin', which leads outside the scene's folder" in record.message

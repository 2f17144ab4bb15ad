"""What a glTF asks for by count and the files it names, read as untrusted (issue 47): a file
asking for a million nodes or instances is refused in seconds, each count's cap names the count
and the setting that raises it, the memory estimate covers what reading and loading a file
really takes (measured in a fresh process), and a buffer or scene file that is not a regular
file of the declared size is refused naming it, before it is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import gltf_costs
from chord.core.errors import InputError
from chord.gltf import container, memory_budget, reader
from chord.scene import ingestion
from tests.conftest import REPO
from tests.unit.gltf.test_untrusted import box_glb, refused, write

# --- counts -------------------------------------------------------------------------------------


def test_a_million_nodes_are_refused_in_seconds(tmp_path):
    path = tmp_path / "obj_0.glb"
    gltf_costs.build("nodes", 1_000_000, path)  # the 17.9 MB file
    start = time.perf_counter()
    with pytest.raises(InputError) as err:
        reader.read(path)
    elapsed = time.perf_counter() - start
    assert str(err.value) == (
        f"{path}: asks for 1000001 nodes, more than chord reads (200000); raise the cap with "
        "CHORD_MAX_NODES=N if the machine has the time and memory, or simplify the asset"
    )
    # refused from the JSON's lengths (1 s here), not after the checks' walk over every node
    # (22 s here) nor the scene-graph load (0.47 ms a node: 8 minutes)
    assert elapsed < 10, elapsed


def test_a_million_instances_from_an_accessor_without_data_are_refused(tmp_path):
    path = tmp_path / "obj_0.glb"
    gltf_costs.build("instances", 1_000_000, path)  # 1 MB: the bound of the unbacked accessor
    assert path.stat().st_size < 1_100_000
    message = refused(path)  # and within the reader's small allocation limit
    assert "asks for 1000001 nodes, 1000000 of them made by EXT_mesh_gpu_instancing" in message


NOUNS = {"empty": "nodes", "primitives": "mesh primitives", "nodes": "world-space mesh parts",
         "joints": "skin joints", "targets": "morph targets"}  # fmt: skip
CAP_OF = {"empty": "nodes", "primitives": "primitives", "nodes": "parts", "joints": "joints",
          "targets": "targets"}  # fmt: skip


@pytest.mark.parametrize("kind", list(NOUNS))
def test_each_count_over_its_cap_is_refused_naming_the_setting(tmp_path, monkeypatch, kind):
    path = tmp_path / "obj_0.glb"
    gltf_costs.build(kind, 30, path)
    name = CAP_OF[kind]
    n = memory_budget.counts(container.read_glb(path)[0])[name]
    assert n >= 30
    env = memory_budget.CAPS[name][1]
    monkeypatch.setenv(env, str(n))
    reader.read(path)  # at the cap: read
    monkeypatch.setenv(env, str(n - 1))
    message = refused(path)
    assert f"asks for {n} {NOUNS[kind]}" in message, message
    assert f"more than chord reads ({n - 1}); raise the cap with {env}=N" in message


def test_a_cap_that_is_not_a_number_is_one_line(tmp_path, monkeypatch):
    doc, blob = box_glb()
    monkeypatch.setenv("CHORD_MAX_PARTS", "lots")
    with pytest.raises(InputError, match=r"^CHORD_MAX_PARTS: 'lots' is not a whole number$"):
        reader.read(write(tmp_path, doc, blob))


#: reads and loads each file named, smallest first, in one fresh process: the peak RSS above
#: the loaded modules after each. The first is a fresh process's; a later one is at least the
#: fresh one (the smaller file's memory, freed or not, serves the larger's first bytes), so the
#: slope between them is at least a fresh process's (the check only gets stricter)
MEASURE_EACH = """
import resource, sys
from pathlib import Path
from bench.gltf_costs import measure
import trimesh
from chord.gltf import reader
from chord.scene import ingestion
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name in sys.argv[1:]:
    measure(Path(name), False)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def _peaks(kind: str, sizes: list[int], folder: Path) -> list[tuple[int, int]]:
    """(measured peak RSS of reading and loading, estimated peak) of each size of ``kind``."""
    paths = [folder / f"{kind}_{n}.glb" for n in sizes]
    for n, path in zip(sizes, paths, strict=True):
        gltf_costs.build(kind, n, path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHORD_MAX_PRIMITIVES": "10000000"}
    out = subprocess.run([sys.executable, "-c", MEASURE_EACH, *map(str, paths)], env=env,
                         check=True, capture_output=True, text=True)  # fmt: skip
    got = []
    for path, measured in zip(paths, out.stdout.split(), strict=True):
        doc, blob = reader._load(path, 10**6)[:2]
        held = sum(len(b) for b in blob if b is not None)
        got.append((int(measured), memory_budget.peak_bytes(doc, path.stat().st_size, held)))
    return got


@pytest.mark.parametrize(
    "kind, small, large",
    [("instances", 2000, 6000), ("primitives", 2000, 6000), ("empty", 10000, 40000)],
)
def test_the_estimate_covers_each_item_read_and_loaded(tmp_path, kind, small, large):
    """Per item (the slope between two sizes, so the modules' own first allocations cancel;
    sizes whose difference the allocator's free lists do not absorb), the estimate is at
    least the peak RSS a fresh process reaches reading and loading it."""
    (m1, e1), (m2, e2) = _peaks(kind, [small, large], tmp_path)
    measured, estimated = (m2 - m1) / (large - small), (e2 - e1) / (large - small)
    assert estimated >= measured, (kind, measured, estimated)


# --- files ----------------------------------------------------------------------------------------


def gltf_with_bin(tmp_path: Path, declared: int | None = None) -> tuple[Path, Path]:
    """``obj_0.gltf`` whose buffer 0 is ``obj_0.bin`` (``declared``: its byteLength)."""
    doc, blob = box_glb()
    doc["buffers"] = [{"uri": "obj_0.bin", "byteLength": declared or len(blob)}]
    (tmp_path / "obj_0.bin").write_bytes(blob)
    path = tmp_path / "obj_0.gltf"
    path.write_text(json.dumps(doc))
    return path, tmp_path / "obj_0.bin"


def test_the_gltf_with_its_bin_reads(tmp_path):
    path, _ = gltf_with_bin(tmp_path)
    assert reader.read(path).doc["meshes"]


def test_a_20_gib_bin_declared_as_152_bytes_is_refused_unread(tmp_path):
    path, bin_file = gltf_with_bin(tmp_path)
    size = bin_file.stat().st_size
    os.truncate(bin_file, 20 * 2**30)  # sparse: no disk, and a read of it would take 20 GiB
    message = refused(path)  # the tracemalloc limit: it was not read
    assert message == (
        f"{path}: buffer 0 refers to {bin_file}, which holds {20 * 2**30} bytes, but its "
        f"byteLength is {size}"
    )


def test_a_bin_shorter_than_declared_is_refused_naming_both(tmp_path):
    path, bin_file = gltf_with_bin(tmp_path)
    size = bin_file.stat().st_size
    os.truncate(bin_file, size - 4)
    assert f"holds {size - 4} bytes, but its byteLength is {size}" in refused(path)


def _link(target, at: Path) -> None:
    at.unlink()
    at.symlink_to(target)


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda b: (b.unlink(), os.mkfifo(b)), "is not a regular file (a FIFO)"),
        (lambda b: (b.unlink(), b.mkdir()), "is not a regular file (a folder)"),
        (
            lambda b: (b.with_name("sub").mkdir(), _link("sub", b)),
            "is not a regular file (a link to {dir}/sub, a folder)",
        ),
        (lambda b: _link("gone.bin", b), "which is a link to {dir}/gone.bin, which does not exist"),
        (lambda b: b.unlink(), "which does not exist"),
    ],
    ids=["fifo", "folder", "link_to_a_folder", "dangling_link", "missing"],
)
def test_a_buffer_that_is_not_a_regular_file_is_named_so(tmp_path, make, what):
    path, bin_file = gltf_with_bin(tmp_path)
    make(bin_file)
    message = refused(path)  # returns: a FIFO is not opened for a blocking read
    assert message.startswith(f"{path}: buffer 0 refers to {bin_file}, which "), message
    assert message.endswith(what.format(dir=os.path.realpath(tmp_path))), message


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
@pytest.mark.parametrize("name", ["scene.glb", "obj_0.glb"])
def test_a_scene_file_that_is_a_fifo_or_a_link_to_dev_zero_is_named_so(tmp_path, name):
    doc, blob = box_glb()
    write(tmp_path, doc, blob, "scene.glb")
    write(tmp_path, doc, blob, "obj_0.glb")
    (tmp_path / name).unlink()
    (tmp_path / name).symlink_to("/dev/zero")
    with pytest.raises(ingestion.SceneError) as err:
        ingestion.discover_objects(tmp_path)
    want = f"{tmp_path / name}: is not a regular file (a link to /dev/zero, a character device)"
    assert str(err.value) == want
    with pytest.raises(InputError) as err:
        reader.read(tmp_path / name)
    assert str(err.value) == want
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    with pytest.raises(InputError, match=r": is not a regular file \(a FIFO\)$"):
        reader.read(tmp_path / name)


def test_a_scene_file_larger_than_the_memory_budget_is_refused_unread(tmp_path):
    doc, blob = box_glb()
    path = write(tmp_path, doc, blob)
    os.truncate(path, 3 * 2**30)  # sparse
    message = refused(path, mem_mb=2000)
    assert message.startswith(f"{path}: holds {3 * 2**30} bytes, more than the ingest job's "
                              "2000 MB (its mem_mb); give ingest more memory")  # fmt: skip


def test_an_image_file_larger_than_any_image_chord_decodes_is_refused_unread(tmp_path):
    doc, blob = box_glb()
    (tmp_path / "big.png").write_bytes(b"")
    os.truncate(tmp_path / "big.png", 2 * reader.MAX_IMAGE_FILE_BYTES)
    doc["images"] = [{"uri": "big.png"}]
    message = refused(write(tmp_path, doc, blob))
    assert f"image 0 refers to {tmp_path / 'big.png'}, which holds " in message
    assert "more than an image of the most pixels chord decodes (134217728) can hold" in message


def test_one_bin_named_by_many_buffers_is_refused_before_any_is_read(tmp_path):
    path, bin_file = gltf_with_bin(tmp_path)
    doc = json.loads(path.read_text())
    os.truncate(bin_file, 2**30)  # sparse: 1 GiB, named 20 times (20 GiB read)
    doc["buffers"] = [{"uri": bin_file.name, "byteLength": 2**30}] * 20
    path.write_text(json.dumps(doc))
    message = refused(path, mem_mb=8000)  # the tracemalloc limit: none was read
    assert "reading it needs an estimated 20.0 GiB, more than the ingest job's 8000 MB" in message


def test_images_read_past_the_budget_are_refused_as_they_are_read(tmp_path):
    doc, blob = box_glb()
    (tmp_path / "big.png").write_bytes(b"")
    os.truncate(tmp_path / "big.png", 8 * 2**20)  # sparse, 8 MiB, named by 8 images
    doc["images"] = [{"uri": "big.png"}] * 8
    message = refused(write(tmp_path, doc, blob), mem_mb=20)  # after the third: 24 MiB read
    assert "more than the ingest job's 20 MB (its mem_mb)" in message

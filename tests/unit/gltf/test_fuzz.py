"""The glTF reader fuzzed: mutated real files (tests/gltf_corpus.py's fuzz_bases: textured and
indexed, multi-node, sparse, instanced, Draco, skinned and animated, a .gltf with external .bin
files) each end as a
correct read or as one :class:`InputError` line, never another exception, never a tracemalloc
peak over :data:`PEAK_LIMIT`. Reads that succeed also go through ingest's
:func:`chord.scene.ingestion.load_source` (trimesh on the plain file).

Mutations: byte flips anywhere; truncations at every chunk boundary (and 1, 4 and 8 bytes
either side) and at random points; every JSON field replaced by values of wrong types, huge
and negative numbers, and 200-deep nesting, or deleted; cycles, self-children and shared
children in the node graph; the .gltf's .bin files cut short; and for each rule of
:data:`RULES` (joint indices, inverse-bind matrices, sparse order, sampler counts, finite and
ordered times, one BIN chunk) a mutation that breaks it, each rule's refusal required.

Quick tier (the default): every JSON field once (the values in turn), 48 flips a file:
1,619 cases (303 correct reads, 177 distinct plain files through load_source), 302 distinct
refusal templates, 10 s of CPU (26 s for the 4,371 cases of 420 sampled JSON mutations and 150
flips a file before issue 49: the same rules reached, no escape in either); tracemalloc peak
2.4 MiB.
``CHORD_FUZZ=full`` runs every JSON field against every value and 10x the flips and cuts:
21,222 cases in 202 s, 662 templates, peak 9.7 MiB (BENCHMARKS.md, "glTF reader fuzz")."""

from __future__ import annotations

import copy
import json
import os
import re
import struct
import time
import traceback
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from chord.core.errors import InputError
from chord.gltf import container, reader
from chord.scene import ingestion
from tests import gltf_corpus as corpus

FULL = os.environ.get("CHORD_FUZZ") == "full"
SCALE = 10 if FULL else 1
MEM_MB = 256  # the reader's budget in the fuzz: no mutated file may claim more
PEAK_LIMIT = 64 * 2**20  # the tracemalloc peak of any one case
# byte-flip cases a .glb, a .gltf (a .glb's take 1 to 4 flips in turn: 12 of each count)
GLB_FLIPS, GLTF_FLIPS = (1500, 1000) if FULL else (48, 48)
VALUES = ["x", None, [], {}, True, 1.5, -1, 0, 2**31, 2**32, 2**63, 10**30, 1e308, -(2**31),
          float("inf"), json.loads("[" * 200 + "]" * 200)]  # fmt: skip


def json_paths(value, path=()):
    """Every (path, value) in a JSON tree."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from json_paths(item, (*path, i))


def replaced(doc: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


DELETE = object()


def graph_edits(doc: dict):
    """Cycles, self-children and shared children in the node graph."""
    n = len(doc.get("nodes", []))
    for i in range(n):
        for j in range(n):
            out = copy.deepcopy(doc)
            out["nodes"][i].setdefault("children", []).append(j)
            yield f"node {i} gets child {j}", out
    if n:
        out = copy.deepcopy(doc)
        out["scenes"] = [{"nodes": list(range(n))}]
        yield "every node a scene root", out


def shown(value) -> str:
    return "deleted" if value is DELETE else repr(value)[:20]


def json_cases(doc: dict, rng: np.random.Generator):
    """Every field replaced by every value (``CHORD_FUZZ=full``); in the quick tier every
    field once, the values taken in turn from a random start: each value lands on a share of
    the fields (51 to 186 fields a base, 17 values: 3 to 11 fields each)."""
    paths = [p for p, _ in json_paths(doc) if p]
    values = [*VALUES, DELETE]
    if FULL:
        cases = [(p, v) for p in paths for v in values]
    else:
        start = int(rng.integers(0, len(values)))
        cases = [(p, values[(start + k) % len(values)]) for k, p in enumerate(paths)]
    for path, value in cases:
        yield f"{'/'.join(map(str, path))} = {shown(value)}", replaced(doc, path, value)
    yield from graph_edits(doc)


def glb_cases(data: bytes, rng: np.random.Generator):
    """(label, bytes) of one GLB's mutations."""
    doc, blob = container.parse_glb(data, "base")
    for label, mutated in json_cases(doc, rng):
        yield label, container.glb_bytes(mutated, blob)
    yield from rule_cases(doc, blob, data)
    bounds, pos = {0, 4, 8, 12}, 12
    while pos + 8 <= len(data):
        bounds |= {pos, pos + 4, pos + 8}
        pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
    cuts = {b + d for b in bounds for d in (-8, -4, -1, 0, 1, 4, 8)}
    cuts |= {int(c) for c in rng.integers(0, len(data), 20 * SCALE)}
    for cut in sorted(c for c in cuts if 0 <= c < len(data)):
        yield f"cut at {cut}", data[:cut]
    for k in range(GLB_FLIPS):
        out = bytearray(data)
        for at in rng.integers(0, len(data), 1 + k % 4):
            out[at] ^= 1 << int(rng.integers(0, 8))
        yield f"flips {k}", bytes(out)


def _written(doc: dict, blob: bytes, acc: int, values, dtype: str) -> bytes:
    """``blob`` with accessor ``acc``'s first elements overwritten by ``values``."""
    a = doc["accessors"][acc]
    start = doc["bufferViews"][a["bufferView"]].get("byteOffset", 0) + a.get("byteOffset", 0)
    data = np.asarray(values, dtype=dtype).tobytes()
    return blob[:start] + data + blob[start + len(data) :]


#: what each rule of chord.gltf.format_rules (and read_accessor's, parse_glb's) says when it
#: refuses: the fuzz must reach every one
RULES = {
    "joints": "holds joint N, but node N's skin N has N joints",
    "inverse_bind": "skin N: inverseBindMatrices accessor N holds N",
    "sparse": "sparse indices must strictly increase",
    "sampler_counts": "input times but N output values",
    "finite_times": "not a finite time",
    "ordered_times": "times must not decrease",
    "one_bin": "a second BIN chunk at byte N; a GLB holds at most one",
}


def rule_cases(doc: dict, blob: bytes, data: bytes):
    """(label, bytes): mutations that break each rule of :data:`RULES` the base can break:
    a joint index at the joint count, inverse-bind matrices of another type or count, repeated
    and decreasing sparse indices, a sampler's output count, a NaN and a decreasing time, and
    a second BIN chunk."""
    extra = struct.pack("<II", 4, container.CHUNK_BIN) + b"\0" * 4
    yield "second BIN chunk", data[:8] + struct.pack("<I", len(data) + 8 + 4) + data[12:] + extra
    for i, acc in enumerate(doc["accessors"]):
        if "sparse" in acc:
            sp = acc["sparse"]
            tmp = {"accessors": [{"bufferView": sp["indices"]["bufferView"], "type": "SCALAR"}],
                   "bufferViews": doc["bufferViews"]}  # fmt: skip
            kind = container.COMPONENTS[sp["indices"]["componentType"]]
            for label, values in (("repeated", [1, 1]), ("decreasing", [2, 1])):
                yield (
                    f"sparse {i} {label}",
                    container.glb_bytes(doc, _written(tmp, blob, 0, values, kind)),
                )
    for i, skin in enumerate(doc.get("skins", [])):
        joints = len(skin["joints"])
        for mesh in doc["meshes"]:
            for prim in mesh["primitives"]:
                if "JOINTS_0" in prim["attributes"]:
                    out = _written(doc, blob, prim["attributes"]["JOINTS_0"], [joints], "u1")
                    yield f"skin {i} joint {joints}", container.glb_bytes(doc, out)
        ibm = skin["inverseBindMatrices"]
        for key, value in (("type", "SCALAR"), ("count", joints - 1)):
            yield (
                f"skin {i} matrices {key}",
                container.glb_bytes(replaced(doc, ("accessors", ibm, key), value), blob),
            )
    for a, anim in enumerate(doc.get("animations", [])):
        for j, sampler in enumerate(anim["samplers"]):
            out = doc["accessors"][sampler["output"]]["count"] - 1
            yield (
                f"animation {a} sampler {j} outputs",
                container.glb_bytes(
                    replaced(doc, ("accessors", sampler["output"], "count"), out), blob
                ),
            )
            for label, times in (("NaN", [0.0, float("nan")]), ("decreasing", [1.0, 0.5])):
                mutated = _written(doc, blob, sampler["input"], times, "<f4")
                yield f"animation {a} sampler {j} {label} time", container.glb_bytes(doc, mutated)


def gltf_cases(path: Path, rng: np.random.Generator):
    """(label, JSON text, {external file: bytes}) of one .gltf's mutations."""
    text = path.read_text()
    for label, mutated in json_cases(json.loads(text), rng):
        yield label, json.dumps(mutated), {}
    for cut in sorted({int(c) for c in rng.integers(0, len(text), 30 * SCALE)}):
        yield f"cut at {cut}", text[:cut], {}
    for k in range(GLTF_FLIPS):
        out = bytearray(text.encode())
        at = int(rng.integers(0, len(out)))
        out[at] ^= 1 << int(rng.integers(0, 7))
        yield f"flips {k}", out.decode("utf-8", errors="replace"), {}
    for uri in ["../obj_0.gltf", "/etc/passwd", "file:///etc/passwd", "%2e%2e/x", "http://x/y"]:
        doc = json.loads(text)
        doc["buffers"][0]["uri"] = uri
        yield f"uri {uri}", json.dumps(doc), {}
    for bin_path in sorted(path.parent.glob("*.bin")):
        data = bin_path.read_bytes()
        for cut in (0, 1, len(data) // 2, len(data) - 1):
            yield f"{bin_path.name} cut at {cut}", text, {bin_path: data[:cut]}


def template(message: str) -> str:
    """A refusal with its values blanked: numbers, quoted text, lists and objects."""
    message = re.sub(r"'[^']*'|\"[^\"]*\"", "S", message)
    message = re.sub(r"\[[^\]]*\]|\{[^}]*\}|\([^)]*\)", "L", message)
    message = re.sub(r"<[^>]*>", "O", message)  # an object's repr and address
    return re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?|inf|nan|True|False|None", "N", message)


class Tally:
    def __init__(self):
        self.cases = self.reads = self.loads = 0
        self.refusals: Counter = Counter()
        self.failures: list[str] = []
        self.slowest = (0.0, "")
        self.peak = (0, "")
        self.seen: set[bytes] = set()
        self.values: dict[str, set[str]] = {}

    def check(self, label: str, path: Path) -> None:
        self.cases += 1
        if " = " in label:  # a JSON field's mutation: which value it was given
            base, value = label.split(": ", 1)[0], label.rsplit(" = ", 1)[1]
            self.values.setdefault(base, set()).add(value)
        tracemalloc.reset_peak()
        start = time.perf_counter()
        try:
            source = reader.read(path, mem_mb=MEM_MB)
            self.reads += 1
            plain = source.glb_bytes()
            if plain not in self.seen:  # each distinct plain file once through trimesh
                self.seen.add(plain)
                self.loads += 1
                ingestion.load_source(path, mem_mb=MEM_MB)
        except InputError as exc:
            message = str(exc)
            if "\n" in message or not message.startswith(str(path)):
                self.failures.append(f"{label}: not one line naming the file: {message!r}")
            self.refusals[template(message.replace(str(path.parent), "DIR"))] += 1
        except Exception as exc:  # the point of the test: nothing else may escape
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.failures.append(
                f"{label}: {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"[:400]
            )
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        self.slowest = max(self.slowest, (took, label))
        self.peak = max(self.peak, (peak, label))


def rewrite(path: Path, data: bytes) -> None:
    """``path`` holding ``data``, as a new file: truncating the old one in place makes ext4
    write it out at close (its auto_da_alloc), milliseconds per case on a busy disk."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[Path]:
    return corpus.fuzz_bases(tmp_path_factory.mktemp("fuzz_bases"))


def test_the_base_files_read(bases):
    for path in bases:
        ingestion.load_source(path, mem_mb=MEM_MB)


def test_mutated_files_end_in_a_read_or_one_line(bases, tmp_path):
    rng = np.random.default_rng(39)
    tally = Tally()
    began = time.perf_counter()
    tracemalloc.start()
    try:
        for base in bases:
            folder = tmp_path / base.stem
            folder.mkdir()
            path = folder / f"obj_0{base.suffix}"
            if base.suffix == ".glb":
                for label, data in glb_cases(base.read_bytes(), rng):
                    rewrite(path, data)
                    tally.check(f"{base.name}: {label}", path)
                continue
            externals = {p: p.read_bytes() for p in base.parent.glob("*.bin")}
            written: dict[Path, bytes] = {}
            for label, text, edits in gltf_cases(base, rng):
                for p, sound in externals.items():
                    data = edits.get(p, sound)
                    if written.get(p) != data:  # only what changed
                        rewrite(folder / p.name, data)
                        written[p] = data
                rewrite(path, text.encode())
                tally.check(f"{base.name}: {label}", path)
    finally:
        tracemalloc.stop()
    took = time.perf_counter() - began
    print(
        f"\nglTF fuzz: {tally.cases} cases ({tally.reads} reads, {tally.loads} through "
        f"load_source), {len(tally.refusals)} distinct refusals, {took:.1f} s; slowest "
        f"{tally.slowest[0] * 1e3:.0f} ms ({tally.slowest[1]}); peak "
        f"{tally.peak[0] / 2**20:.1f} MiB ({tally.peak[1]})"
    )
    assert not tally.failures, f"{len(tally.failures)} escaped:\n" + "\n".join(tally.failures[:40])
    said = "\n".join(tally.refusals)
    unreached = [rule for rule, words in RULES.items() if words not in said]
    assert not unreached, f"no mutation reached the rules {unreached}"
    assert tally.peak[0] < PEAK_LIMIT, tally.peak
    # every base's fields got every value (and a deletion), beside its other mutations
    every = {shown(v) for v in [*VALUES, DELETE]}
    assert tally.values == {base.name: every for base in bases}, tally.values
    assert tally.cases >= (20000 if FULL else 1500)

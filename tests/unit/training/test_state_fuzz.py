"""The project's own state files fuzzed (issue 47), as tests/unit/gltf/test_fuzz.py fuzzes
users' glTF: each file other jobs write and a reader reads back (progress.json for chord status,
time_limit.json, out_of_memory.txt, metrics.json for aggregate and the sweep, a checkpoint's
metadata) mutated (every field replaced by values of the wrong type or deleted, the document
replaced by another JSON value, cut short at many points, bytes flipped, not UTF-8, empty, a
folder in its place) ends in a sound read whose fields have the types their users compute with,
or one line naming the file (an InputError, a damaged note, a logged warning): never another
exception. And aggregate keeps every other scene's row beside a damaged metrics.json."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from chord.cli import state_files
from chord.core.errors import InputError
from chord.evaluation import metrics_file, plots
from chord.resources import out_of_memory
from chord.stages import aggregate
from chord.training import checkpoint, run_loop, slurm_time_limit

VALUES = ["x", None, [], {}, True, 1.5, -1, 0, 2**63, 1e308, float("inf"), float("nan"),
          json.loads("[" * 200 + "]" * 200)]  # fmt: skip
NUMBERS = [*plots.BAR_METRICS, *(m for m, _ in plots.BAR_MARKS.values())]


def mutations(doc: dict, rng: np.random.Generator):
    """(label, bytes) of a JSON document's mutations."""
    for key in doc:
        for value in [*VALUES, "DELETE"]:
            out = {k: v for k, v in doc.items() if not (k == key and value == "DELETE")}
            if value != "DELETE":
                out[key] = value
            yield f"{key} = {value!r:.20}", json.dumps(out).encode()
    for whole in (list(doc.values()), "x", 3, None):
        yield f"the whole a {type(whole).__name__}", json.dumps(whole).encode()
    data = json.dumps(doc).encode()
    for cut in range(0, len(data), 7):
        yield f"cut at {cut}", data[:cut]
    for k in range(60):
        out = bytearray(data)
        for at in rng.integers(0, len(out), 1 + k % 3):
            out[at] ^= 1 << int(rng.integers(0, 8))
        yield f"flips {k}", bytes(out)
    yield "not UTF-8", b"\xff\xfe" + data


def each_case(tmp_path: Path, doc: dict, name: str, rng):
    """Write each mutation of ``doc`` to ``name`` (and a folder in its place): (label, path)."""
    path = tmp_path / name
    for label, data in mutations(doc, rng):
        path.unlink(missing_ok=True)  # a new file: ext4 writes a truncated one out at close
        path.write_bytes(data)
        yield label, path
    path.unlink()
    path.mkdir()
    yield "a folder", path
    path.rmdir()


def one_line(label: str, message: str, path: Path) -> None:
    assert "\n" not in message and str(path) in message, (label, message)


def test_progress_json_for_chord_status(tmp_path):
    doc = {name: {state_files.TEXT: "x", state_files.INTEGER: 3}.get(kind, 1.5)
           for name, kind in state_files.PROGRESS_FIELDS.items()}  # fmt: skip
    kinds = {state_files.TEXT: str, state_files.INTEGER: int}
    seen = 0
    for label, path in each_case(tmp_path, doc, "progress.json", np.random.default_rng(0)):
        got, problem = state_files.read_state(path, state_files.PROGRESS_FIELDS)
        if problem is not None:
            assert got is None
            one_line(label, problem, path)
            continue
        seen += 1
        for name, value in got.items():  # what status computes with
            want = kinds.get(state_files.PROGRESS_FIELDS[name], int | float)
            assert isinstance(value, want) and not isinstance(value, bool), (label, name, value)
            if name in state_files.TIMES:
                assert math.isfinite(value), (label, name)
    assert seen  # some mutations keep a sound file (a field deleted, a number for a number)


def test_the_time_limit_record(tmp_path, caplog):
    doc = {"job": "41", "deadline": 1.7e9, "tier": "full", "runtime_h": 4.0, "checkpoint": None}
    caplog.set_level(logging.WARNING, logger=slurm_time_limit.__name__)
    for label, path in each_case(tmp_path, doc, "time_limit.json", np.random.default_rng(1)):
        caplog.clear()
        got = slurm_time_limit.previous_record(path)
        if got is None:
            (record,) = caplog.records  # one warning naming the file
            one_line(label, record.getMessage(), path)
            continue
        assert not caplog.records
        # what time_limit compares: numbers with numbers, strings with strings
        assert isinstance(got["deadline"], int | float) and not isinstance(got["deadline"], bool)
        assert isinstance(got["tier"], str), label
        assert isinstance(got.get("runtime_h", 0), int | float), label
        assert got.get("checkpoint") is None or isinstance(got["checkpoint"], str), label


def test_the_out_of_memory_record(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / out_of_memory.RECORD
    noise = [(f"noise {k}", bytes(rng.integers(0, 256, 12, dtype=np.uint8))) for k in range(40)]
    cases = [("two tiers", b"full\nlowvram\n"), ("not UTF-8", b"\xfffull\n"), ("empty", b""),
             *noise]  # fmt: skip
    for label, data in cases:
        path.write_bytes(data)
        try:
            got = out_of_memory.read(path)
        except InputError as exc:
            one_line(label, str(exc), path)
            continue
        assert all(isinstance(t, str) and t == t.strip() and t for t in got), label
    path.unlink()
    path.mkdir()
    with pytest.raises(InputError, match=r"out_of_memory.txt: an unreadable out-of-memory record"):
        out_of_memory.read(path)


def metrics_doc(scene: str) -> dict:
    return {"format": metrics_file.FORMAT, "scene": scene, "iteration": 30, "tier": "full",
            **{m: 0.25 for m in NUMBERS}, "static_warning": False,
            "curve": [0.1, 0.2]}  # fmt: skip


def test_metrics_json_for_aggregate_keeps_every_other_scene(tmp_path):
    good = tmp_path / "good" / "metrics.json"
    good.parent.mkdir()
    good.write_text(json.dumps(metrics_doc("good")))
    folder = tmp_path / "bad"
    folder.mkdir()
    refused, plotted = 0, 0
    for label, path in each_case(folder, metrics_doc("bad"), "metrics.json",
                                 np.random.default_rng(3)):  # fmt: skip
        try:
            doc = metrics_file.read(path, NUMBERS)
        except InputError as exc:
            one_line(label, str(exc), path)
            refused += 1
        else:
            for m in NUMBERS:
                assert doc.get(m) is None or type(doc[m]) in (int, float), (label, m)
            # a plotted value it accepted (huge, infinite, NaN, null, absent): drawn as n/a
            # where it cannot be drawn, tests/unit/evaluation/test_plots.py
            plotted += label.split(" = ")[0] in NUMBERS
        df = aggregate.table({"good": good, "bad": path})  # never raises for one bad scene
        row = df.loc["good"]
        assert all(row[m] == 0.25 for m in NUMBERS), label
        assert bool(row["static_warning"]) is False
    assert refused and plotted


def test_metrics_json_none_readable_is_one_line(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text('{"format": "chord-metrics/1", "mean_jerk": "high"}')
    with pytest.raises(InputError, match=r"^aggregate: no readable metrics.json; .*mean_jerk is"):
        aggregate.table({"a": path})


def test_a_checkpoints_metadata(tmp_path):
    kinds = {str: "x", int: 1, dict: {}, bool: False, list: []}
    doc = {name: kinds[types[0]] for name, types in
           {**checkpoint.FIELDS, **checkpoint.HANDOFF_FIELDS}.items()}  # fmt: skip
    doc["format"] = checkpoint.CKPT_FORMAT
    path = tmp_path / "ckpt_000001.pt"
    rng = np.random.default_rng(4)
    cases = []
    for key in doc:
        if key == "format":
            continue
        for value in [*VALUES[:10], "DELETE"]:
            out = {k: v for k, v in doc.items() if not (k == key and value == "DELETE")}
            if value != "DELETE":
                out[key] = value
            cases.append((f"{key} = {value!r:.20}", out))
    torch.save(doc, path)
    data = path.read_bytes()
    for label, out in cases:
        path.unlink()  # a new file: ext4 writes a truncated one out at close
        torch.save(out, path)
        try:
            got = run_loop.load_checkpoint(path)
        except InputError as exc:
            one_line(label, str(exc), path)
            continue
        assert type(got["iteration"]) is int, label
        for name, types in {**checkpoint.FIELDS, **checkpoint.HANDOFF_FIELDS}.items():
            if name in got:
                assert isinstance(got[name], types), (label, name)
                assert not isinstance(got[name], bool) or bool in types, (label, name)
    for cut in sorted({int(c) for c in rng.integers(0, len(data), 25)}):
        path.unlink()
        path.write_bytes(data[:cut])
        with pytest.raises(InputError) as err:
            run_loop.load_checkpoint(path)
        one_line(f"cut at {cut}", str(err.value), path)

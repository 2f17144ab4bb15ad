"""A training's out-of-memory record (chord.resources.out_of_memory): what it holds, when it
is written and removed, the error that ends the leanest tier, and the test hook that raises
torch's out-of-memory error on named tiers and ranks. The escalation it drives:
tests/unit/resources/test_tiers.py."""

from __future__ import annotations

import logging
import pickle
import sys
import types

import pytest
import torch

from chord.resources import out_of_memory as oom
from chord.resources.tiers import REMEDIES

ORDER = ("full", "split", "offload")


def test_the_record_is_one_tier_a_line_and_a_missing_one_is_empty(tmp_path):
    path = tmp_path / "results" / "hop" / "ckpt" / oom.RECORD
    assert oom.read(path) == set()
    oom.record(path, "full")  # the folders are made
    oom.record(path, "split")
    assert path.read_text() == "full\nsplit\n"
    path.write_text(" full \n\nsplit\n  \n")
    assert oom.read(path) == {"full", "split"}


def test_only_torchs_out_of_memory_error_counts(monkeypatch):
    assert oom.is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not oom.is_out_of_memory(RuntimeError("CUDA out of memory"))
    assert not oom.is_out_of_memory(MemoryError())  # host RAM: no leaner tier helps
    monkeypatch.delitem(sys.modules, "torch")  # torch not imported: not consulted
    assert not oom.is_out_of_memory(RuntimeError("x"))


def test_an_out_of_memory_exit_is_recorded_and_a_finished_run_clears_the_record(tmp_path, caplog):
    path = tmp_path / oom.RECORD
    with caplog.at_level(logging.ERROR):
        with pytest.raises(torch.cuda.OutOfMemoryError):
            with oom.recorded(path, "full", ORDER):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        assert oom.read(path) == {"full"} and caplog.text == ""  # a leaner tier is left
        with pytest.raises(KeyError):  # another error: re-raised, no record, the old one kept
            with oom.recorded(path, "split", ORDER):
                raise KeyError("x")
        assert oom.read(path) == {"full"}
        with oom.recorded(path, "split", ORDER):
            pass
    assert not path.exists()
    with oom.recorded(path, "split", ORDER):  # nothing to clear
        pass


def test_the_leanest_tier_out_of_memory_names_the_tiers_tried_and_the_remedies(tmp_path, caplog):
    path = tmp_path / oom.RECORD
    oom.record(path, "full")
    with caplog.at_level(logging.ERROR):
        with pytest.raises(torch.cuda.OutOfMemoryError):
            with oom.recorded(path, "offload", ORDER):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    assert oom.read(path) == {"full", "offload"}
    assert "on every tier tried (full, offload): offload is the leanest" in caplog.text
    assert REMEDIES in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR):  # no order given: nothing to say
        with pytest.raises(torch.cuda.OutOfMemoryError):
            with oom.recorded(path, "offload"):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    assert caplog.text == ""


def test_the_hook_raises_on_the_named_tiers_and_ranks_only():
    for spec, tier, rank in [
        ("full", "full", 0),
        (" split , full", "full", 3),
        ("x,full@1", "full", 1),
    ]:
        with pytest.raises(torch.cuda.OutOfMemoryError, match=f"tier '{tier}', rank {rank}"):
            oom.inject(spec, tier, rank)
    for spec, tier, rank in [
        ("", "full", 0),
        ("split", "full", 0),
        ("full@1", "full", 0),
        (",", "", 0),
    ]:
        oom.inject(spec, tier, rank)


def test_a_single_gpu_training_is_rank_0():
    with pytest.raises(torch.cuda.OutOfMemoryError, match="rank 0"):
        oom.inject("full@0", "full")
    oom.inject("full@1", "full")


def test_each_rank_of_a_wrapped_training_runs_the_hook():
    target = oom.with_injected(dict, "full@1", "full")
    assert pickle.loads(pickle.dumps(target))(group=None, x=1) == {"group": None, "x": 1}
    assert target(group=types.SimpleNamespace(rank=0))["group"].rank == 0
    with pytest.raises(torch.cuda.OutOfMemoryError, match="rank 1"):
        target(group=types.SimpleNamespace(rank=1))
    with pytest.raises(torch.cuda.OutOfMemoryError, match="rank 0"):  # one process: rank 0
        oom.with_injected(dict, "full@0", "full")(group=None)

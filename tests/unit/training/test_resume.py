"""Where a training stage starts (chord.training.resume): the coarse hand-off the fine stage
continues and its size, the newest readable checkpoint of the configuration, the seed they
carry, and which of them a stage restores. Checkpoints here are small dicts in the real file
format; no training runs."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from chord.config import settings
from chord.core.errors import InputError
from chord.training import checkpoint, resume
from chord.training.checkpoint import CKPT_FORMAT


def method(**kw):
    return settings.method_from_mapping({"size": "32*16", "seed": 5, **kw})


def write(path, iteration, seed=11, **kw):
    ckpt = {"format": CKPT_FORMAT, "iteration": iteration, "seed": seed, "config_hash": "h"}
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save_checkpoint(path, {**ckpt, **kw})
    return path


def test_only_the_fine_stage_continues_a_handoff(tmp_path):
    m = method()
    assert resume.load_handoff("coarse", tmp_path / "unread.pt", m) == (None, m)
    with pytest.raises(ValueError, match="coarse hand-off"):
        resume.load_handoff("fine", None, m)


def test_the_fine_stage_continues_at_the_size_the_coarse_stage_trained_at(tmp_path):
    """A coarse stage that escalated to a lowres tier hands off its size: the fine stage
    trains at it (its state's tensors are of that size)."""
    m = method()
    state, fine = resume.load_handoff("fine", write(tmp_path / "a.pt", 4, size="16*8"), m)
    assert state["iteration"] == 4 and fine == dataclasses.replace(m, size="16*8")
    state, fine = resume.load_handoff("fine", write(tmp_path / "b.pt", 4, size="32*16"), m)
    assert fine == m
    state, fine = resume.load_handoff("fine", write(tmp_path / "c.pt", 4), m)  # no size: older
    assert state["iteration"] == 4 and fine == m


def test_the_newest_readable_checkpoint_is_resumed(tmp_path, caplog):
    folder = tmp_path / "h"
    assert resume.newest_checkpoint(folder) is None  # no folder yet
    folder.mkdir()
    assert resume.newest_checkpoint(folder) is None
    write(folder / "ckpt_000002.pt", 2)
    write(folder / "ckpt_000010.pt", 10)
    write(folder / "ckpt_000009.pt", 9)
    assert resume.newest_checkpoint(folder)["iteration"] == 10
    # a file cut short by a kill (the newest) is skipped, saying so: the one before is used
    (folder / "ckpt_000011.pt").write_bytes(b"PK\x03\x04 cut short")
    with caplog.at_level(logging.WARNING, logger="chord.training.resume"):
        assert resume.newest_checkpoint(folder)["iteration"] == 10
    assert "skipping" in caplog.text and "ckpt_000011.pt" in caplog.text
    for p in folder.glob("ckpt_0000[01]*.pt"):
        p.write_bytes(b"not a checkpoint")
    assert resume.newest_checkpoint(folder) is None


def test_a_stage_resumes_its_configurations_checkpoint_with_its_seed(tmp_path):
    root = tmp_path / "ckpt"
    write(root / "h1" / "ckpt_000003.pt", 3, seed=11)
    start = resume.find_start(root, "h1", method(seed=5))
    assert start.folder == root / "h1" and start.seed == 11
    assert start.resume["iteration"] == 3 and start.handoff is None


def test_a_changed_configuration_starts_fresh_with_the_methods_seed(tmp_path, caplog):
    root = tmp_path / "ckpt"
    with caplog.at_level(logging.INFO, logger="chord.training.resume"):
        start = resume.find_start(root, "h1", method(seed=5))  # nothing yet: no message
        assert caplog.text == ""
        write(root / "h1" / "ckpt_000003.pt", 3)
        write(root / "h0" / "ckpt_000007.pt", 7, seed=2)
        (root / "h2").mkdir()
        start = resume.find_start(root, "h2", method(seed=5))
    assert start.folder == root / "h2" and start.seed == 5 and start.resume is None
    assert "configuration changed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chord.training.resume"):
        resume.find_start(tmp_path / "other", "h1", method())
        (tmp_path / "other" / "h1").mkdir(parents=True)
        (tmp_path / "other" / "ckpt_000001.pt").touch()  # a file beside the folders: no config
        resume.find_start(tmp_path / "other", "h1", method())
    assert "configuration changed" not in caplog.text


def test_the_fine_stage_takes_the_handoffs_seed_and_refuses_another_configurations(tmp_path):
    root = tmp_path / "ckpt"
    handed = {"config_hash": "h1", "seed": 3, "iteration": 4}
    start = resume.find_start(root, "h1", method(seed=5), handed, tmp_path / "coarse.pt")
    assert start.seed == 3 and start.handoff is handed and start.resume is None
    write(root / "h1" / "ckpt_000006.pt", 6, seed=3)
    start = resume.find_start(root, "h1", method(seed=5), handed, tmp_path / "coarse.pt")
    assert start.seed == 3 and start.resume["iteration"] == 6
    other = {**handed, "config_hash": "h0"}
    with pytest.raises(InputError, match="coarse.pt: written with another configuration"):
        resume.find_start(root, "h1", method(), other, tmp_path / "coarse.pt")


@pytest.mark.parametrize(
    "handoff, ckpt, first, restored",
    [
        (None, None, 1, []),
        (None, 1, 2, [1]),  # a checkpoint of the first iteration is resumed too
        (None, 2, 3, [2]),
        (4, None, 5, [4]),
        (4, 5, 6, [4, 5]),  # the fine stage's first iteration, checkpointed
        (4, 6, 7, [4, 6]),
        (4, 4, 5, [4]),  # the fine stage's own checkpoint of the hand-off's iteration: no newer
        (4, 3, 5, [4]),
    ],
)
def test_a_stage_restores_the_handoff_then_a_newer_checkpoint(
    monkeypatch, tmp_path, handoff, ckpt, first, restored
):
    done = []

    def restore(trainer, state):
        done.append(state["iteration"])
        return state["iteration"] + 1

    monkeypatch.setattr(resume.checkpoint, "restore", restore)
    start = resume.Start(
        tmp_path,
        0,
        handoff=None if handoff is None else {"iteration": handoff},
        resume=None if ckpt is None else {"iteration": ckpt},
    )
    assert start.restore(object(), "fine") == first and done == restored

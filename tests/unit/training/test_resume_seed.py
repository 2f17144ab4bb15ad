"""chord.training.resume: where a training stage starts. An unseeded run (``seed: -1``) draws its
seed once; a run resumed from its checkpoints, and the fine stage after the coarse one, keep
that seed, so their random draws are those of one uninterrupted run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from chord.training import checkpoint, resume, rng, run_loop
from tests.unit.training.test_run_loop import Killed, dies_at, make_trainer, method


@pytest.fixture(autouse=True)
def deterministic():
    """Bit-exact comparisons need torch's deterministic CPU kernels (as the stage sets)."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def params(trainer) -> dict:
    return {k: p.detach().clone() for k, p in trainer.scene.dynamic["obj_0"].named_parameters()}


def test_an_unseeded_run_resumes_with_the_seed_it_drew(tmp_path, monkeypatch):
    """The first start draws 1234 (the fake's first answer) and its checkpoints record it; the
    run is killed after iteration 2. The next start (which would draw 98765) resumes from
    iteration 2 with 1234, restores 1234 into a trainer built with any other seed, and draws
    the cameras and noise of the uninterrupted run: its parameters end bit for bit the same.
    The fine stage continuing the hand-off takes its seed too."""
    draws = iter([1234, 98765, 555])
    monkeypatch.setattr(rng, "secrets", SimpleNamespace(randbelow=lambda n: next(draws)))
    m = method(seed=-1, iterations=4, batch_size=1, save_interval=100)
    ckpt = tmp_path / "ckpt"

    first = resume.find_start(ckpt, "h", m)
    assert first.resume is None and first.seed == 1234
    killed = make_trainer(m, seed=first.seed)
    assert first.restore(killed, "coarse") == 1
    dies_at(killed, 3)
    with pytest.raises(Killed):
        run_loop.run(killed, 1, 5, config_hash="h", checkpoint_dir=first.folder)

    again = resume.find_start(ckpt, "h", m)
    assert again.resume is not None and again.resume["iteration"] == 2
    assert again.seed == 1234, "a resumed unseeded run drew a new seed"
    other = make_trainer(m, seed=98765)
    assert again.restore(other, "coarse") == 3 and other.seed == 1234

    resumed = make_trainer(m, seed=again.seed)
    assert again.restore(resumed, "coarse") == 3
    whole = make_trainer(m, seed=1234)
    run_loop.run(whole, 1, 3, config_hash="h")
    for it in (3, 4):  # the draws after the resume are the uninterrupted run's
        assert torch.equal(resumed.cameras_at(it)["viewmats"], whole.cameras_at(it)["viewmats"])
    run_loop.run(resumed, 3, 5, config_hash="h", checkpoint_dir=again.folder)
    run_loop.run(whole, 3, 5, config_hash="h")
    got, want = params(resumed), params(whole)
    for k in want:
        assert torch.equal(got[k], want[k]), k

    handoff = checkpoint.load_checkpoint(sorted(again.folder.glob("ckpt_*.pt"))[-1])
    fine = resume.find_start(tmp_path / "fine", "h", m, handoff_state=handoff)
    assert fine.seed == 1234

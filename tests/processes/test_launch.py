"""chord.training.multi_gpu_launch: the ranks of a multi-GPU tier in one job (two CPU processes,
gloo). Their
outcome is the job's: rank 0's result, or the failing rank's error of its own type with its
traceback; an out-of-memory error in one rank wins over what it causes in the others; SIGTERM
stops every rank after the same iteration, with rank 0's checkpoint."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from chord.core.errors import InputError
from chord.training import multi_gpu_launch, run_loop

# -- rank targets (module level: they reach the ranks by pickle) -----------------------------


def sum_of_ranks(group, device, folder):
    logging.getLogger("chord.test_launch").info("hello from rank %d", group.rank)
    Path(folder, f"rank{group.rank}").write_text(f"{group.world_size} {device}")
    t = torch.tensor([float(group.rank + 1)], device=device)
    group.all_reduce(t)
    return {"rank": group.rank, "sum": float(t), "threads": torch.get_num_threads()}


def fails_in_rank_1(group, device, error):
    if group.rank == 1:
        time.sleep(0.5)  # rank 0 is waiting in the collective below by then
        if error == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (rank 1's test)")
        if error == "input":
            raise InputError("a bad input seen by rank 1")
        if error == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError("a bug in rank 1")
    group.all_reduce(torch.zeros(1, device=device))  # fails once rank 1 has gone
    return "rank 0 done"


def interrupted_in_rank_1(group, device, folder):
    """Rank 1 alone gets SIGTERM during iteration 2 of a real training (rank 0 writes)."""
    from tests.unit.training.test_run_loop import make_trainer, method, tiny_scene

    torch.use_deterministic_algorithms(True)
    scene, mesh = tiny_scene()
    tr = make_trainer(method(batch_size=1), scene, mesh, group=group)

    def log(rec):
        if group.rank == 1 and rec["it"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    ckpts = Path(folder, f"ckpt{group.rank}")
    run_loop.run(tr, 1, 50, config_hash="h", checkpoint_dir=ckpts, log=log, writer=group.rank == 0)
    return "not interrupted"


# -- tests -----------------------------------------------------------------------------------


def test_ranks_run_the_target_and_rank_0s_result_returns(tmp_path, caplog):
    with caplog.at_level("INFO"):
        out = multi_gpu_launch.launch(
            sum_of_ranks, 2, env=dict(os.environ), kwargs={"folder": tmp_path}
        )
    assert out["rank"] == 0 and out["sum"] == 3.0  # 1 + 2: the ranks met in one group
    assert out["threads"] == max(1, torch.get_num_threads() // 2)  # the cores shared out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert (tmp_path / "rank1").read_text() == "2 cpu"
    # every rank's log records reach this process's handlers, named by rank
    assert "rank 0: hello from rank 0" in caplog.text and "rank 1: hello from rank 1" in caplog.text


def test_a_failing_rank_fails_the_launch_with_its_traceback(caplog):
    with caplog.at_level("INFO"), pytest.raises(multi_gpu_launch.RankFailed) as err:
        multi_gpu_launch.launch(
            fails_in_rank_1, 2, env=dict(os.environ), kwargs={"error": "bug"}, grace_s=5
        )
    assert "rank 1 of 2 failed: ValueError: a bug in rank 1" in str(err.value)
    cause = str(err.value.__cause__)
    assert "Traceback" in cause and "in fails_in_rank_1" in cause and "a bug in rank 1" in cause
    assert "rank 1 of 2 failed:\nTraceback" in caplog.text  # the rule's log has it too
    assert "rank 0 of 2 stopped too" in caplog.text  # rank 0's collective failed after it


def test_out_of_memory_in_one_rank_is_the_jobs_error():
    """Rank 0's collective fails because rank 1 is gone; the out-of-memory error is the one
    raised, so the training's record sees it and the retry escalates."""
    with pytest.raises(torch.cuda.OutOfMemoryError, match="rank 1's test") as err:
        multi_gpu_launch.launch(
            fails_in_rank_1, 2, env=dict(os.environ), kwargs={"error": "oom"}, grace_s=5
        )
    assert "in fails_in_rank_1" in str(err.value.__cause__)


def test_a_bad_input_in_a_rank_keeps_its_type():
    with pytest.raises(InputError, match="a bad input seen by rank 1"):
        multi_gpu_launch.launch(
            fails_in_rank_1, 2, env=dict(os.environ), kwargs={"error": "input"}, grace_s=5
        )


def test_a_rank_killed_by_a_signal_fails_the_launch():
    with pytest.raises(multi_gpu_launch.RankFailed, match="rank 1 of 2 exited with signal SIGKILL"):
        multi_gpu_launch.launch(
            fails_in_rank_1, 2, env=dict(os.environ), kwargs={"error": "kill"}, grace_s=5
        )


def test_sigterm_in_one_rank_stops_every_rank_after_the_same_iteration(tmp_path, caplog):
    """chord.training.run_loop.run agrees on SIGTERM over the group: rank 0, which did not get the
    signal,
    stops after iteration 2 too and writes its checkpoint; the launch raises Interrupted, as
    one process would (without the agreement rank 0 goes on and fails in iteration 3)."""
    with caplog.at_level("INFO"), pytest.raises(run_loop.Interrupted, match="after iteration 2"):
        multi_gpu_launch.launch(
            interrupted_in_rank_1, 2, env=dict(os.environ), kwargs={"folder": tmp_path}
        )
    assert "stopped too (interrupted): SIGTERM after iteration 2" in caplog.text
    assert max(p.name for p in (tmp_path / "ckpt0").iterdir()) == "ckpt_000002.pt"
    assert not (tmp_path / "ckpt1").exists()  # rank 1 does not write

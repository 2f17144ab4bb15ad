"""Two processes (gloo, CPU) with batch 1 each make the same update as one process with
batch 2 (METHOD §18)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from chord.training.distributed import Group
from tests.unit.training.test_run_loop import make_trainer, method, tiny_scene


def params_after_one_step(rank: int, world: int, batch: int) -> dict:
    torch.use_deterministic_algorithms(True)
    scene, mesh = tiny_scene()
    tr = make_trainer(method(batch_size=batch), scene, mesh)
    tr.group = Group(rank, world, tr.device)
    if world > 1:
        tr.sync_from_rank0()
    tr.step(2)
    return {k: v.detach().clone() for k, v in scene.dynamic["obj_0"].named_parameters()}


def worker(rank: int, world: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        params = params_after_one_step(rank, world, 1)
        if rank == 0:
            torch.save(params, out)
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_equal_one_process_with_twice_the_batch(tmp_path):
    out = tmp_path / "ranked.pt"
    mp.spawn(worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    two = torch.load(out, weights_only=True)
    one = params_after_one_step(0, 1, 2)
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-6, rtol=1e-5, msg=k)
    alone = params_after_one_step(0, 1, 1)  # rank 0's video only: a different update
    assert not torch.allclose(alone["layer1.cp_deform"], one["layer1.cp_deform"])


class FakeNCCL:
    """Two identical ranks in one process, with NCCL's rule: a collective takes only tensors on
    the rank's device. On a GPU node torch's default device is the CPU and the trainer's is
    CUDA; here the default is ``meta`` and the trainer's the CPU, the same mismatch."""

    def __init__(self, device):
        self.device, self.calls = torch.device(device), []

    def _check(self, tensor):
        self.calls.append(tensor.device)
        if tensor.device != self.device:
            raise RuntimeError(f"NCCL: tensor on {tensor.device}, expected {self.device}")

    def all_reduce(self, tensor, op=None):
        self._check(tensor)
        tensor.mul_(2)  # the other rank holds the same values

    def broadcast(self, tensor, src=0):
        self._check(tensor)

    def install(self, monkeypatch):
        monkeypatch.setattr(dist, "all_reduce", self.all_reduce)
        monkeypatch.setattr(dist, "broadcast", self.broadcast)


def test_collectives_take_tensors_on_the_trainers_device_not_torchs_default(monkeypatch):
    scene, mesh = tiny_scene()
    tr = make_trainer(method(batch_size=1), scene, mesh)
    tr.regularisers(2, tr.cameras_at(2))
    obj = scene.dynamic["obj_0"]
    before = {k: p.grad.clone() for k, p in obj.param_groups().items() if p.grad is not None}
    assert before and len(before) < len(obj.param_groups())  # some parameters have no gradient
    nccl = FakeNCCL(tr.device)
    nccl.install(monkeypatch)
    tr.group = Group(0, 2, tr.device)
    with torch.device("meta"):  # anything made without device=... lands here
        tr.sync_from_rank0()
        tr.all_reduce()
        seed = tr.group.broadcast_int(1234)
    assert seed == 1234 and nccl.calls and set(nccl.calls) == {tr.device}
    for k, p in obj.param_groups().items():  # the mean of two equal ranks: unchanged
        if k in before:
            torch.testing.assert_close(p.grad, before[k])
        else:
            assert p.grad is None  # no gradient on any rank stays None


def test_torchrun_on_cuda_selects_the_local_gpu_before_starting_nccl(monkeypatch):
    from chord.training import distributed

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw))
    )
    env = {"WORLD_SIZE": "4", "RANK": "6", "LOCAL_RANK": "2"}
    group = distributed.from_env(env)
    cuda2 = torch.device("cuda", 2)
    assert calls == [("set_device", cuda2), ("nccl", {"device_id": cuda2})]
    assert (group.rank, group.world_size, group.device) == (6, 4, cuda2)
    scene, mesh = tiny_scene()  # a scene elsewhere than the group's GPU is refused up front
    with pytest.raises(ValueError, match="its process group on cuda:2"):
        make_trainer(method(batch_size=1), scene, mesh, group=group)


def test_group_check_itself_rejects_a_tensor_on_another_device():
    """Group's own check, not NCCL's: a collective of a group on cuda:0 refuses a CPU tensor,
    and a CPU group a tensor on another device, before torch.distributed is called."""
    group = Group(rank=0, world_size=2, device="cuda:0")
    with pytest.raises(RuntimeError, match="loss: a tensor on cpu handed to a collective of the "
                                           "process group on cuda:0"):  # fmt: skip
        group.all_reduce(torch.zeros(3), "loss")
    with pytest.raises(RuntimeError, match="seed: a tensor on meta handed to a collective"):
        Group(rank=1, world_size=2).broadcast(torch.zeros(1, device="meta"), "seed")
    assert Group(device="cuda:0").all_reduce(torch.ones(1), "alone").item() == 1  # world of one


def nan_on_rank_1_worker(rank: int, world: int, init_file: str, out: str) -> None:
    """Rank 1's teacher returns NaN entries (zeroed by RF-SDS, so its gradients stay finite),
    rank 0's does not; then one healthy step on both."""
    from tests.unit.training.test_run_loop import NaNTeacher

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.use_deterministic_algorithms(True)
        scene, mesh = tiny_scene()
        tr = make_trainer(method(batch_size=1), scene, mesh)
        tr.group = Group(rank, world, tr.device)
        tr.sync_from_rank0()
        tr.guidance = NaNTeacher(tr.guidance)
        tr.guidance.fp32 = rank != 1  # healthy on rank 0
        obj = scene.dynamic["obj_0"]
        snap = lambda: {k: p.detach().clone() for k, p in obj.param_groups().items()}  # noqa: E731
        before = snap()
        rec = tr.step(2)
        result = {
            "skipped": rec["skipped"],
            "nan": rec["nan"],
            "own_nan": int(tr.teacher_nan),  # this rank's count, before the sum
            "nonfinite": tr.nonfinite,
            "before": before,
            "after_nan_step": snap(),
        }
        tr.guidance.fp32 = True  # healthy everywhere: both ranks step
        rec = tr.step(3)
        result.update(healthy_skipped=rec["skipped"], healthy_nonfinite=tr.nonfinite)
        result["after_healthy_step"] = snap()
        torch.save(result, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_teacher_nan_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    """METHOD §18: the teacher's NaN count is summed over ranks with the gradients, so a NaN
    on rank 1 alone skips the step on both ranks: no parameter moves on either and both count
    the non-finite step (rank 0, with finite gradients and no NaN of its own, would otherwise
    step and the ranks' parameters would part)."""
    out = tmp_path / "rank"
    mp.spawn(nan_on_rank_1_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2)
    ranks = [torch.load(f"{out}.{r}", weights_only=True) for r in range(2)]
    assert [r["own_nan"] for r in ranks] == [0, 3]  # NaNTeacher: 3 entries, on rank 1 only
    for r, res in enumerate(ranks):
        assert (res["skipped"], res["nan"], res["nonfinite"]) == (1, 3, 1), r
        for k, p in res["after_nan_step"].items():
            assert torch.equal(p, res["before"][k]), (r, k)  # no Adam step
        assert (res["healthy_skipped"], res["healthy_nonfinite"]) == (0, 0), r
        moved = res["after_healthy_step"]["cp_deform"]
        assert not torch.equal(moved, res["before"]["cp_deform"]), r  # a healthy step moves
    for k in ranks[0]["before"]:  # the same decisions: the ranks stay identical
        assert torch.equal(ranks[0]["after_healthy_step"][k], ranks[1]["after_healthy_step"][k]), k

"""Two processes (gloo, CPU) with batch 1 each make the same update as one process with
batch 2 (METHOD §18)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.unit.test_train import make_trainer, method, tiny_scene


def params_after_one_step(rank: int, world: int, batch: int) -> dict:
    torch.use_deterministic_algorithms(True)
    scene, mesh = tiny_scene()
    tr = make_trainer(method(batch_size=batch), scene, mesh)
    tr.rank, tr.world_size = rank, world
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

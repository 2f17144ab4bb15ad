"""The test cluster itself: GPU kinds are scheduled as asked, and requests the node cannot meet
are refused at submission (what the workflow's per-tier requests rely on)."""

from __future__ import annotations

import pytest

from tests.slurm.cluster import GPU_KINDS, GPUS
from tests.slurm.conftest import tres, wait_until


def test_jobs_get_a_gpu_of_the_kind_they_ask_for(slurm_cluster, tmp_path):
    # the GPU kinds asked for, and the devices they may get (gpu0 is big, gpu1 and gpu2 small)
    asks = {"big:1": {"big"}, "small:1": {"small"}, "1": {"big", "small"}}
    devices = {kind: {str(i) for i, (k, _) in enumerate(GPUS) if k == kind} for kind in GPU_KINDS}
    ids = {}
    for gpus in asks:
        out = tmp_path / f"{gpus}.out"
        proc = slurm_cluster.run(
            "sbatch",
            "--parsable",
            f"--gpus={gpus}",
            "--mem=100",
            f"--output={out}",
            "--wrap",
            "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES",
        )
        ids[proc.stdout.strip()] = gpus

    def finished():
        records = slurm_cluster.sacct("JobID", "State", "AllocTRES")
        done = {r["JobID"]: r for r in records if r["JobID"] in ids and r["State"] == "COMPLETED"}
        return done if len(done) == len(ids) else None

    done = wait_until("the GPU test jobs", finished, timeout=60)
    for jobid, gpus in ids.items():
        alloc = tres({"ReqTRES": done[jobid]["AllocTRES"]})
        kinds = {k.split(":", 1)[1] for k in alloc if k.startswith("gres/gpu:")}
        assert len(kinds) == 1 and kinds <= asks[gpus], (gpus, alloc)
        assert alloc["gres/gpu"] == "1"
        # Slurm narrows the job to its device
        (kind,) = kinds
        line = (tmp_path / f"{gpus}.out").read_text().strip()
        assert line.startswith("CUDA_VISIBLE_DEVICES="), line
        assert line.split("=", 1)[1] in devices[kind], (gpus, line)


@pytest.mark.parametrize("ask", [["--gpus=huge:1"], ["--mem=100000"], ["--gpus=big:2"]], ids=str)
def test_a_request_the_node_cannot_meet_is_refused(slurm_cluster, ask):
    proc = slurm_cluster.run("sbatch", *ask, "--wrap", "true", check=False)
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in proc.stderr

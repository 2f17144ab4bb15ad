"""The machine's GPUs (nvidia-smi), the gpu resource's slots and per-job GPU locks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from chord.resources import gpus
from tests.conftest import REPO


def test_visible_gpus_and_slots(monkeypatch, tmp_path):
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}) == ["2", "5"]
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    # CPU only: trainings run side by side, limited by the cores
    assert gpus.gpu_slots({"CUDA_VISIBLE_DEVICES": ""}) == max(1, os.cpu_count() or 1)
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            if [ "$1" = "-L" ]; then
              echo "GPU 0: NVIDIA A10 (UUID: GPU-a)"; echo "GPU 1: NVIDIA A10 (UUID: GPU-b)"
              echo "GPU 2: NVIDIA L40S (UUID: GPU-c)"
            elif [ "$1" = "--query-gpu=index,uuid,name,memory.total" ]; then
              echo "0, GPU-a, NVIDIA A10, 23028"; echo "1, GPU-b, NVIDIA A10, 23028"
              echo "2, GPU-c, NVIDIA L40S, 46068"
            else
              echo 'Field "compute_cap" is not a valid field to query.' >&2; exit 2
            fi
            """
        )
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpus.visible_gpus({}) == ["0", "1", "2"]
    assert gpus.gpu_slots({}) == 3
    node = gpus.node({})  # this driver has no compute_cap field: asked again without it
    assert (node.gpus, node.card) == (3, gpus.Card("NVIDIA A10", 23028))  # the smallest one
    node = gpus.node({"CUDA_VISIBLE_DEVICES": "GPU-c"})
    assert (node.gpus, node.card) == (1, gpus.Card("NVIDIA L40S", 46068))
    assert gpus.node({}, gpus_per_node=2).gpus == 2  # the config's count wins
    # the config's label: the least a card of it has, the GPU count as visible here
    label = gpus.node({}, gpu_mem_gb=48)
    assert (label.gpus, label.total_bytes, label.source) == (3, 48 * 10**9, "config")
    assert gpus.node({"CUDA_VISIBLE_DEVICES": ""}) is None
    assert gpus.node({"CUDA_VISIBLE_DEVICES": ""}, gpu_mem_gb=80).gpus == 1


def test_concurrent_jobs_get_distinct_gpus(tmp_path):
    """Two jobs on a 2-GPU machine hold different GPUs; a third waits for a free one."""
    env1, env2, env3 = ({"CUDA_VISIBLE_DEVICES": "0,1"} for _ in range(3))
    with gpus.job_gpu(env1, tmp_path), gpus.job_gpu(env2, tmp_path):
        assert {env1["CUDA_VISIBLE_DEVICES"], env2["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
        held = env1["CUDA_VISIBLE_DEVICES"]
    with gpus.job_gpu(env3, tmp_path):  # both released: the first GPU again
        assert env3["CUDA_VISIBLE_DEVICES"] == "0" == held


def test_gpu_slots_across_processes(tmp_path):
    """Separate processes (as Snakemake's jobs are) get distinct CUDA_VISIBLE_DEVICES."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from chord.resources import gpus
        env = {{"CUDA_VISIBLE_DEVICES": "3,4"}}
        with gpus.job_gpu(env, {str(tmp_path)!r}):
            print(env["CUDA_VISIBLE_DEVICES"], flush=True)
            time.sleep(float(sys.argv[1]))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen(
        [sys.executable, "-c", code, "3"], stdout=subprocess.PIPE, text=True, env=env
    )
    got_first = first.stdout.readline().strip()  # it holds its GPU from here on
    second = subprocess.run(
        [sys.executable, "-c", code, "0"], capture_output=True, text=True, env=env, check=True
    )
    first.wait()
    assert {got_first, second.stdout.strip()} == {"3", "4"}


def test_default_profile_caps_gpus_at_the_local_count(monkeypatch):
    """profiles/default is rendered by Snakemake's profile parser (YTE) on this machine; with
    no GPU the trainings run side by side on the CPU, limited by the cores."""
    from snakemake.profiles import ProfileConfigFileParser

    path = REPO / "profiles/default/config.yaml"
    for visible, slots in (("0,1,2", 3), ("", max(1, os.cpu_count() or 1))):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        with open(path) as f:
            parsed = ProfileConfigFileParser().parse(f)
        assert parsed["resources"] == [f"gpu={slots}"]
    assert parsed["cores"] == "all" and parsed["keep-going"] == "True"
    # a failed CPU stage is not run again (a bad input fails the same way every time); the
    # training rules retry per memory tier on their own
    assert parsed["rerun-incomplete"] == "True" and int(parsed["retries"]) == 0

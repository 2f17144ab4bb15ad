"""chord.tiers: tier parsing, auto choice, escalation, size handling, out-of-memory records,
the OOM exit status, and GPU assignment for concurrent jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from chord import config as cc
from chord import tiers
from chord.stages import adapter
from chord.stages.train import config_hash
from tests.conftest import REPO


@pytest.fixture
def default_tiers():
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cc.validate_config(conf)
    return tiers.parse(conf["tiers"])


def test_default_tiers_follow_the_seed_document(default_tiers):
    """full / split (48 GB) / offload (24 GB, mmgp) / lowres 576*320 then 416*240."""
    t = default_tiers
    assert list(t)[:4] == ["full", "split", "offload", "lowres"]
    assert t["full"].flags == {} and t["full"].gpu_mem_gb == 80
    assert t["split"].gpu_mem_gb == 48 and t["split"].flags == {
        "split_sds_backward": True,
        "split_render_backward": True,
        "split_render_chunk_size": 21,
    }
    assert t["offload"].gpu_mem_gb == 24 and t["offload"].flags["enable_mmgp"] is True
    assert t["offload"].host_mem_gb > t["split"].host_mem_gb  # mmgp keeps the DiT in host RAM
    assert [t[n].size for n in list(t)[3:]] == ["576*320", "416*240"]
    assert t["offload"].mem_mb == 96 * 1024 and t["full"].runtime_min == 12 * 60


def test_parse_rejects_tiers_out_of_escalation_order():
    with pytest.raises(cc.ConfigError, match="fullest first"):
        tiers.parse({"small": {"gpu_mem_gb": 24}, "big": {"gpu_mem_gb": 80}})
    with pytest.raises(cc.ConfigError, match="reserved"):
        tiers.parse({"auto": {"gpu_mem_gb": 24}})
    with pytest.raises(cc.ConfigError, match="multiples of 16"):
        tiers.parse({"odd": {"gpu_mem_gb": 24, "size": "100*50"}})


@pytest.mark.parametrize(
    "gpu_mem_gb, expected",
    [(None, "full"), (141, "full"), (80, "full"), (48, "split"), (40, "offload"), (24, "offload")]
    + [(16, "lowres"), (12, "lowres_min"), (8, "lowres_min")],
)
def test_auto_picks_the_first_tier_that_fits(default_tiers, gpu_mem_gb, expected):
    assert tiers.auto(default_tiers, gpu_mem_gb) == expected
    assert tiers.base("auto", default_tiers, gpu_mem_gb) == expected
    assert tiers.base("split", default_tiers, gpu_mem_gb) == "split"  # explicit wins


def test_escalation_moves_past_tiers_that_ran_out_of_memory(default_tiers):
    t = default_tiers
    assert tiers.for_attempt("full", 1, t, {"full"}) == "full"  # attempt 1: the start tier
    assert tiers.for_attempt("full", 2, t, {"full"}) == "split"
    assert tiers.for_attempt("full", 3, t, {"full", "split"}) == "offload"
    assert tiers.for_attempt("full", 2, t, set()) == "full"  # other failure: same tier
    assert tiers.for_attempt("split", 2, t, {"full"}) == "split"
    leanest = list(t)[-1]
    assert tiers.for_attempt(leanest, 4, t, set(t)) == leanest  # nowhere leaner to go


def test_memory_flags_keep_the_hash_and_a_lower_size_changes_it(default_tiers):
    method = cc.method_from_mapping({"size": "832*480"})
    guidance = cc.guidance_from_mapping({})
    h = config_hash(method, guidance)
    for name in ("full", "split", "offload"):
        applied = tiers.apply(method, default_tiers[name])
        assert config_hash(applied, guidance) == h, name
    offload = tiers.apply(method, default_tiers["offload"])
    assert offload.enable_mmgp and offload.split_render_chunk_size == 21
    lowres = tiers.apply(method, default_tiers["lowres"])
    assert lowres.size == "576*320" and config_hash(lowres, guidance) != h
    # the size only ever goes down: a small method size is kept
    small = cc.method_from_mapping({"size": "64*32"})
    assert tiers.apply(small, default_tiers["lowres"]).size == "64*32"


def test_tier_flags_left_out_keep_the_method_value(default_tiers):
    method = cc.method_from_mapping({"split_sds_backward": True, "mmgp_transformer_budget": 500})
    assert tiers.apply(method, default_tiers["full"]).split_sds_backward is True
    assert tiers.apply(method, default_tiers["offload"]).mmgp_transformer_budget == 500


def test_out_of_memory_record_notes_the_tier_and_clears_on_success(tmp_path):
    record = tmp_path / "ckpt" / tiers.OOM_RECORD
    with pytest.raises(torch.OutOfMemoryError):
        with tiers.out_of_memory_record(record, "full"):
            tiers.inject_out_of_memory("full, split", "full")
    with pytest.raises(RuntimeError):  # any other error leaves no record
        with tiers.out_of_memory_record(record, "split"):
            raise RuntimeError("not memory")
    assert tiers.read_out_of_memory(record) == {"full"}
    with tiers.out_of_memory_record(record, "split"):
        tiers.inject_out_of_memory("full", "split")  # not listed: no error
    assert not record.exists()
    assert tiers.read_out_of_memory(record) == set()


def test_out_of_memory_exits_with_its_own_status(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        with adapter.stage_logging(str(tmp_path / "x.log")):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert exc.value.code == adapter.EXIT_OUT_OF_MEMORY == 3
    assert "out of GPU memory" in capsys.readouterr().err
    assert "out of GPU memory" in (tmp_path / "x.log").read_text()
    with pytest.raises(SystemExit) as exc:
        with adapter.stage_logging(str(tmp_path / "y.log")):
            raise ValueError("bad input")
    assert exc.value.code == adapter.EXIT_INPUT


def test_visible_gpus_and_slots(monkeypatch, tmp_path):
    assert tiers.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}) == ["2", "5"]
    assert tiers.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    # CPU only: trainings run side by side, limited by the cores
    assert tiers.gpu_slots({"CUDA_VISIBLE_DEVICES": ""}) == max(1, os.cpu_count() or 1)
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            if [ "$1" = "-L" ]; then
              echo "GPU 0: NVIDIA A10 (UUID: GPU-a)"; echo "GPU 1: NVIDIA A10 (UUID: GPU-b)"
              echo "GPU 2: NVIDIA L40S (UUID: GPU-c)"
            else
              echo "0, GPU-a, 23028"; echo "1, GPU-b, 23028"; echo "2, GPU-c, 46068"
            fi
            """
        )
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert tiers.visible_gpus({}) == ["0", "1", "2"]
    assert tiers.gpu_slots({}) == 3
    assert tiers.gpu_memory_gb({}) == pytest.approx(23028 / 1024)  # the smallest one
    assert tiers.gpu_memory_gb({"CUDA_VISIBLE_DEVICES": "2"}) == pytest.approx(46068 / 1024)


def test_concurrent_jobs_get_distinct_gpus(tmp_path):
    """Two jobs on a 2-GPU machine hold different GPUs; a third waits for a free one."""
    env1, env2, env3 = ({"CUDA_VISIBLE_DEVICES": "0,1"} for _ in range(3))
    with tiers.job_gpu(env1, tmp_path), tiers.job_gpu(env2, tmp_path):
        assert {env1["CUDA_VISIBLE_DEVICES"], env2["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
        held = env1["CUDA_VISIBLE_DEVICES"]
    with tiers.job_gpu(env3, tmp_path):  # both released: the first GPU again
        assert env3["CUDA_VISIBLE_DEVICES"] == "0" == held


def test_gpu_slots_across_processes(tmp_path):
    """Separate processes (as Snakemake's jobs are) get distinct CUDA_VISIBLE_DEVICES."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from chord import tiers
        env = {{"CUDA_VISIBLE_DEVICES": "3,4"}}
        with tiers.job_gpu(env, {str(tmp_path)!r}):
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
    assert parsed["rerun-incomplete"] == "True" and int(parsed["retries"]) >= 1


def test_lowres_size_is_recorded_and_the_fine_stage_continues_at_it(tmp_path):
    """A lowres tier's size enters the hash and checkpoint folder and is recorded in the
    hand-off; the fine stage, on a fuller tier, continues at that size."""
    from chord import demo
    from chord.stages import train as train_stage
    from tests.stages.test_geometry_stages import train_inputs

    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)
    m = cc.method_from_mapping(
        {
            "gs_init_num": 600,
            "surface_target_num": 300,
            "cp_num": 8,
            "size": "48*32",
            "frame_num": 5,
            "iterations": 4,
            "batch_size": 1,
            "seed": 3,
            "prev_frame_number": 2,
            "back_iter": 3,
            "arap_sample_num": 64,
            "add_cp_objs": ["obj_0"],
            "add_cp_layer_iter": 3,
            "add_cp_num": 12,
        }
    )
    inputs = train_inputs(data, tmp_path / "results", "hop", m)
    guidance = cc.guidance_from_mapping({"backend": "oracle"})
    t = tiers.parse({"full": {"gpu_mem_gb": 80}, "tiny": {"gpu_mem_gb": 8, "size": "32*16"}})
    lean = tiers.apply(m, t["tiny"])
    ckpts = tmp_path / "ckpt"
    for stage, tier in (("coarse", "tiny"), ("fine", "full")):
        train_stage.run_stage(
            stage,
            inputs=inputs,
            out=tmp_path / f"{stage}.pt",
            loss_log=tmp_path / f"{stage}.tsv",
            checkpoint_dir=ckpts / stage,
            method=tiers.apply(m, t[tier]),
            guidance=guidance,
            handoff=tmp_path / "coarse.pt" if stage == "fine" else None,
            tier=tier,
        )
    coarse = torch.load(tmp_path / "coarse.pt", weights_only=True)
    fine = torch.load(tmp_path / "fine.pt", weights_only=True)
    assert (coarse["tier"], coarse["size"], coarse["iteration"]) == ("tiny", "32*16", 2)
    assert (fine["tier"], fine["size"], fine["iteration"]) == ("full", "32*16", 4)
    h = config_hash(lean, guidance)
    assert h != config_hash(m, guidance) and coarse["config_hash"] == fine["config_hash"] == h
    assert [p.name for p in (ckpts / "coarse").iterdir()] == [h]
    assert [p.name for p in (ckpts / "fine").iterdir()] == [h]

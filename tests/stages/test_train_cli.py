"""`chord train` takes CHORD's train.py command lines (the seed documents' commands)."""

from __future__ import annotations

import os
import shlex

import pytest

from chord import cli, demo, train, train_cli
from chord.guidance import tiny_models

SEED_48GB = """--ex_name <experiment_name> --mesh_source_path data/<scene_name> --model
trained/<scene_name> --prompt "<prompt>" --split_sds_backward --split_render_backward
--split_render_chunk_size 21 --ckpt_dir ./Wan2.2-I2V-A14B --task i2v-A14B --size "832*480"
--n_prompt "." --use_tiny_vae --early_stop --init_voxel_size 0.015 --lambda_ground 0.0
--batch_size 4 --lambda_arap 2.4 --invert_bg_prob -0.5 --azim_l 0.0 --azim_r 360.0
--ref_azim 60.0 --elev_l -10.0 --elev_r 40.0 --cam_radius 2.0 --resample_timestep --cp_num 60
--lambda_dis_time 2.0 --last_cfg_scale 12.0 --init_cfg_scale 25.0 --frame_num 41
--save_interval 500 --iterations 3000"""
SEED_24GB = SEED_48GB.replace("--split_sds_backward", "--enable_mmgp --split_sds_backward")


def tiny_train_flags(data, model, **overrides) -> list[str]:
    """`chord train` arguments for a CPU-sized run of a 5-frame demo scene."""
    values = {
        "size": "48*32",
        "frame_num": 5,
        "iterations": 3,
        "batch_size": 1,
        "seed": 5,
        "gs_init_num": 400,
        "surface_target_num": 300,
        "cp_num": 12,
        "arap_sample_num": 64,
        **overrides,
    }
    args = [
        "train",
        "--mesh_source_path",
        str(data),
        "--model",
        str(model),
        "--prompt",
        "a block hops",
    ]
    for key, value in values.items():
        args += [f"--{key}", str(value)]
    return args


@pytest.mark.parametrize("command", [SEED_48GB, SEED_24GB])
def test_seed_commands_parse(command):
    args, method = train_cli.parse(shlex.split(command))
    assert args.mesh_source_path == "data/<scene_name>" and args.ckpt_dir == "./Wan2.2-I2V-A14B"
    assert method.split_render_chunk_size == 21 and method.use_tiny_vae
    assert method.resample_timestep and method.early_stop and method.invert_bg_prob == -0.5
    assert method.size == "832*480" and method.iterations == 3000 and method.cp_num == 60
    assert method.enable_mmgp == ("--enable_mmgp" in command)


def test_bad_flags_are_errors(capsys):
    with pytest.raises(SystemExit):
        train_cli.parse(shlex.split(SEED_48GB) + ["--cp_nmu", "3"])
    assert "unrecognized arguments: --cp_nmu" in capsys.readouterr().err
    code = cli.main(["train", *shlex.split(SEED_48GB), "--size", "833*480"])
    assert code == 2 and "nearest valid sizes: 832*480, 848*480" in capsys.readouterr().err
    code = cli.main(["train", *shlex.split(SEED_48GB), "--dit_fsdp"])
    assert code == 2 and "--dit_fsdp: sharded Wan is not supported" in capsys.readouterr().err


def test_seed_command_runs_against_a_tiny_saved_model(tmp_path, caplog, monkeypatch):
    from safetensors.torch import save_file

    from chord.guidance.tiny_vae import TinyVAEEncoder

    wan_dir = tiny_models.write_tiny_wan(tmp_path / "Wan2.2-I2V-A14B")
    tiny = tmp_path / "lighttaew2_1.safetensors"
    save_file(TinyVAEEncoder().state_dict(), str(tiny))
    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)
    command = (
        SEED_48GB.replace("data/<scene_name>", str(data))
        .replace("trained/<scene_name>", str(tmp_path / "trained"))
        .replace("./Wan2.2-I2V-A14B", str(wan_dir))
        .replace("<experiment_name>", "seed")
        .replace("<prompt>", "a block hops")
    )
    # the CPU-sized overrides come last and win, as with argparse on the release's script
    small = [
        "--tiny_vae_path",
        str(tiny),
        "--size",
        "64*32",
        "--frame_num",
        "5",
        "--iterations",
        "3",
        "--batch_size",
        "1",
        "--gs_init_num",
        "400",
        "--surface_target_num",
        "300",
        "--cp_num",
        "12",
        "--arap_sample_num",
        "64",
        "--split_render_chunk_size",
        "2",
    ]
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with caplog.at_level("INFO"):
        assert cli.main(["train", *shlex.split(command), *small]) == 0
    # set before CUDA starts (METHOD §15) and checked by the training's preflight
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    preflight = [r.getMessage() for r in caplog.records if r.getMessage().startswith("preflight")]
    assert any("allocator" in line and "pass" in line for line in preflight), preflight
    assert any("wan folder" in line and "pass" in line for line in preflight), preflight
    assert "rendering with the torch rasterizer" in caplog.text
    run = tmp_path / "trained" / "seed"
    ckpt = train.load_checkpoint(run / "train" / "coarse.pt")
    assert ckpt["iteration"] == 2  # --early_stop: ⌊2N/3⌋ = 2 of N = 3
    assert (ckpt["render_backend"], ckpt["device"]) == ("torch", "cpu")
    assert (run / "condition" / "text.safetensors").is_file()
    assert (run / "train" / "coarse_losses.tsv").read_text().count("\n") == 3


def test_sigkill_mid_run_then_rerun_equals_an_uninterrupted_run(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)

    def command(model):
        flags = tiny_train_flags(
            data, model, iterations=10, save_interval=2, seed=7, prev_frame_number=2, back_iter=3
        )
        return [sys.executable, "-m", "chord.cli", *flags]

    assert subprocess.run(command(tmp_path / "once"), capture_output=True).returncode == 0
    victim = subprocess.Popen(
        command(tmp_path / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ckpts = tmp_path / "killed" / "default" / "checkpoints" / "coarse"
    deadline = time.time() + 300
    while time.time() < deadline and not list(ckpts.glob("*/ckpt_000004.pt")):
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "default" / "train" / "coarse.pt").exists()
    assert subprocess.run(command(tmp_path / "killed"), capture_output=True).returncode == 0
    a = train.load_checkpoint(tmp_path / "once" / "default" / "train" / "coarse.pt")
    b = train.load_checkpoint(tmp_path / "killed" / "default" / "train" / "coarse.pt")
    assert a["iteration"] == b["iteration"] == 10
    for k in a["motion"]:
        assert a["motion"][k].equal(b["motion"][k]), k
    for name in a["optimizers"]:
        for i, st in a["optimizers"][name]["state"].items():
            assert st["exp_avg"].equal(b["optimizers"][name]["state"][i]["exp_avg"])


def test_torchrun_two_ranks_equal_one_process_with_twice_the_batch(tmp_path):
    import subprocess
    import sys

    import torch

    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)

    def flags(model, batch):
        return tiny_train_flags(data, model, batch_size=batch)

    one = subprocess.run(
        [sys.executable, "-m", "chord.cli", *flags(tmp_path / "one", 2)],
        capture_output=True,
        text=True,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "chord.cli",
            *flags(tmp_path / "two", 1),
        ],
        capture_output=True,
        text=True,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    a = train.load_checkpoint(tmp_path / "one" / "default" / "train" / "coarse.pt")
    b = train.load_checkpoint(tmp_path / "two" / "default" / "train" / "coarse.pt")
    for k in a["motion"]:
        torch.testing.assert_close(b["motion"][k], a["motion"][k], atol=1e-5, rtol=1e-4, msg=k)

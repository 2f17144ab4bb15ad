"""`chord train` takes CHORD's train.py command lines (the seed documents' commands)."""

from __future__ import annotations

import csv
import os
import shlex

import pytest

from chord.cli import main, upstream_train
from chord.guidance import tiny_models
from chord.scene import demo
from chord.training import checkpoint, progress

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
    args, method, memory = upstream_train.parse(shlex.split(command))
    assert args.mesh_source_path == "data/<scene_name>" and args.ckpt_dir == "./Wan2.2-I2V-A14B"
    assert memory.split_render_chunk_size == 21 and method.use_tiny_vae
    assert method.resample_timestep and method.early_stop and method.invert_bg_prob == -0.5
    assert method.size == "832*480" and method.iterations == 3000 and method.cp_num == 60
    assert memory.enable_mmgp == ("--enable_mmgp" in command) and memory.split_sds_backward
    assert not hasattr(method, "split_sds_backward")  # memory flags are never method keys


def test_bad_flags_are_errors(capsys):
    with pytest.raises(SystemExit):
        upstream_train.parse(shlex.split(SEED_48GB) + ["--cp_nmu", "3"])
    assert "unrecognized arguments: --cp_nmu" in capsys.readouterr().err
    code = main.main(["train", *shlex.split(SEED_48GB), "--size", "833*480"])
    assert code == 2 and "nearest valid sizes: 832*480, 848*480" in capsys.readouterr().err
    code = main.main(["train", *shlex.split(SEED_48GB), "--dit_fsdp"])
    assert code == 2 and "--dit_fsdp: sharded Wan is not supported" in capsys.readouterr().err


def test_seed_command_runs_against_a_tiny_saved_model(tmp_path, caplog, monkeypatch):
    wan_dir = tiny_models.write_tiny_wan(tmp_path / "Wan2.2-I2V-A14B")
    # raw Wan latents, as lighttaew2_1's (the preflight checks the scale with the Wan VAE)
    tiny = tiny_models.write_tiny_vae(tmp_path / "lighttaew2_1.safetensors", wan_dir)
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
        assert main.main(["train", *shlex.split(command), *small]) == 0
    # set before CUDA starts (METHOD §15) and checked by the training's preflight
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    preflight = [r.getMessage() for r in caplog.records if r.getMessage().startswith("preflight")]
    assert any("allocator" in line and "pass" in line for line in preflight), preflight
    assert any("wan folder" in line and "pass" in line for line in preflight), preflight
    assert "rendering with the torch rasterizer" in caplog.text
    run = tmp_path / "trained" / "seed"
    ckpt = checkpoint.load_checkpoint(run / "train" / "coarse.pt")
    assert ckpt["iteration"] == 2  # --early_stop: ⌊2N/3⌋ = 2 of N = 3
    assert (ckpt["render_backend"], ckpt["device"]) == ("torch", "cpu")
    assert (run / "condition" / "text.safetensors").is_file()
    assert (run / "train" / "coarse_losses.tsv").read_text().count("\n") == 3
    # its progress lines (the first iteration's and the last's: the run is under a minute)
    # and live previews (iterations // 10 = 0, so every iteration) in the run folder's train/
    lines = [progress.parse_line(r.getMessage()) for r in caplog.records]
    its = [f["it"] for tag, f in filter(None, lines) if tag == progress.TAG]
    assert its[0] == "1/2" and its[-1] == "2/2"
    assert (run / "train" / "previews" / "latest.mp4").is_file()


def assert_same_state(a, b, where: str = "state") -> None:
    """``a`` and ``b`` equal field by field: dicts by their keys, sequences item by item,
    tensors bit for bit (dtype and shape too)."""
    import torch

    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape, where
        assert a.equal(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def read_loss_log(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_sigkill_mid_run_then_rerun_equals_an_uninterrupted_run(tmp_path):
    """A run killed (SIGKILL: no chance to save) after its iteration-4 checkpoint; the same
    command again resumes after the newest checkpoint left, K - 1: it logs so, rewrites none
    of the checkpoints before K, keeps the loss log's rows before K as they were (a marker put
    into them survives), and ends in the uninterrupted run's state, every tensor and every
    optimizer field bit for bit (a CPU run is deterministic)."""
    import signal
    import subprocess
    import sys
    import time

    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)

    def command(model):
        flags = tiny_train_flags(
            data, model, iterations=10, save_interval=2, seed=7, prev_frame_number=2, back_iter=3
        )
        return [sys.executable, "-m", "chord.cli.main", *flags]

    once = subprocess.run(command(tmp_path / "once"), capture_output=True, text=True)
    assert once.returncode == 0, once.stderr[-3000:]
    victim = subprocess.Popen(
        command(tmp_path / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    run = tmp_path / "killed" / "default"
    ckpts = run / "checkpoints" / "coarse"
    deadline = time.monotonic() + 300  # a bound on waiting only; nothing asserts a time
    while time.monotonic() < deadline and not list(ckpts.glob("*/ckpt_000004.pt")):
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (run / "train" / "coarse.pt").exists()

    # the resume point, from the checkpoints the kill left (save points 1, 2, 4, 5, 6, 8, 10)
    left = sorted(ckpts.glob("*/ckpt_*.pt"))
    assert len({p.parent for p in left}) == 1, left  # one configuration's folder
    iterations = [checkpoint.load_checkpoint(p)["iteration"] for p in left]
    assert iterations == [int(p.stem.split("_")[1]) for p in left]
    resume_at = max(iterations) + 1
    assert 5 <= resume_at <= 10, f"killed after iteration {resume_at - 1}: nothing to resume"
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in left}
    # the killed run logged every iteration up to its last checkpoint, as the whole run did;
    # mark those rows: a rerun that recomputed them would overwrite the marker. Mid-run the
    # loss log grows beside the checkpoints; the output gets it at the end
    history = left[0].parent / "losses.tsv"
    rows = read_loss_log(history)
    once_rows = read_loss_log(tmp_path / "once" / "default" / "train" / "coarse_losses.tsv")
    kept = [r for r in rows if int(r["it"]) < resume_at]
    assert kept == once_rows[: resume_at - 1]
    with open(history, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]), delimiter="\t")
        w.writeheader()
        w.writerows({**r, "sds": "kept"} if int(r["it"]) < resume_at else r for r in rows)

    rerun = subprocess.run(command(tmp_path / "killed"), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming coarse from iteration {resume_at}\n" in rerun.stderr, rerun.stderr[-3000:]
    assert f"coarse: iterations {resume_at}..10 " in rerun.stderr, rerun.stderr[-3000:]
    for path, stat in before.items():  # not rewritten (a rewrite replaces the file)
        assert (path.stat().st_ino, path.stat().st_mtime_ns) == stat, path.name
    rows = read_loss_log(run / "train" / "coarse_losses.tsv")
    assert [int(r["it"]) for r in rows] == list(range(1, 11))
    assert [r["sds"] for r in rows[: resume_at - 1]] == ["kept"] * (resume_at - 1)
    assert rows[resume_at - 1 :] == once_rows[resume_at - 1 :]

    a = checkpoint.load_checkpoint(tmp_path / "once" / "default" / "train" / "coarse.pt")
    b = checkpoint.load_checkpoint(run / "train" / "coarse.pt")
    assert a["iteration"] == b["iteration"] == 10
    assert a["motion"] and all(a["optimizers"][n]["state"] for n in a["optimizers"])
    assert all(  # Adam's fields, for every parameter of every object
        set(st) == {"exp_avg", "exp_avg_sq", "step"}
        for opt in a["optimizers"].values()
        for st in opt["state"].values()
    )
    assert_same_state(a, b, "coarse.pt")  # motion, optimizers, seed, config hash, size, ...


def test_torchrun_two_ranks_equal_one_process_with_twice_the_batch(tmp_path):
    import subprocess
    import sys

    import torch

    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)

    def flags(model, batch):
        return tiny_train_flags(data, model, batch_size=batch)

    one = subprocess.run(
        [sys.executable, "-m", "chord.cli.main", *flags(tmp_path / "one", 2)],
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
            "chord.cli.main",
            *flags(tmp_path / "two", 1),
        ],
        capture_output=True,
        text=True,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    a = checkpoint.load_checkpoint(tmp_path / "one" / "default" / "train" / "coarse.pt")
    b = checkpoint.load_checkpoint(tmp_path / "two" / "default" / "train" / "coarse.pt")
    assert set(a["motion"]) == set(b["motion"]) and set(a["optimizers"]) == set(b["optimizers"])
    for k in a["motion"]:
        torch.testing.assert_close(
            b["motion"][k], a["motion"][k], atol=1e-5, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}"
        )
    for name, opt in a["optimizers"].items():  # the averaged gradients drove the same steps
        assert b["optimizers"][name]["param_groups"] == opt["param_groups"], name
        torch.testing.assert_close(
            b["optimizers"][name]["state"],
            opt["state"],
            atol=1e-5,
            rtol=1e-4,
            msg=lambda m, name=name: f"{name}: {m}",
        )

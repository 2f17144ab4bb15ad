"""One `chord train` iteration in a process where every module neither on the GPU image nor in
bench/gpu_wheels.txt is blocked (bench/gpu_imports.py); in tests/processes, the slow tier, as
it starts a process that imports the training's whole stack (15-30 s)."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.bench.test_gpu_imports import GUARD, ROOT


def test_one_training_iteration_imports_only_what_the_device_has(tmp_path):
    """`chord train` (a tiny saved Wan folder, the torch rasteriser on the CPU, one iteration)
    with every module neither on the GPU image nor carried blocked: a wheel missing from
    bench/gpu_wheels.txt fails here, not on the device (ftfy needs wcwidth, for one)."""
    from safetensors.torch import save_file

    from chord.guidance import tiny_models
    from chord.guidance.tiny_vae import TinyVAEEncoder
    from chord.scene import demo
    from chord.training import checkpoint

    wan = tiny_models.write_tiny_wan(tmp_path / "wan")
    tiny = tmp_path / "taew.safetensors"
    save_file(TinyVAEEncoder().state_dict(), str(tiny))
    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)
    flags = {
        "mesh_source_path": data,
        "model": tmp_path / "trained",
        "prompt": "a block hops",
        "ckpt_dir": wan,
        "tiny_vae_path": tiny,
        "size": "48*32",
        "frame_num": 5,
        "iterations": 1,
        "batch_size": 1,
        "gs_init_num": 400,
        "surface_target_num": 300,
        "cp_num": 12,
        "arap_sample_num": 64,
        "ex_name": "guarded",
    }
    args = [a for k, v in flags.items() for a in (f"--{k}", str(v))]
    proc = subprocess.run(
        [sys.executable, str(GUARD), "-m", "chord.cli.main", "train", *args, "--use_tiny_vae"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rendering with the torch rasterizer" in proc.stderr
    # no MP4 encoder on the image: the live previews are off, the training goes on
    assert "live previews off: imageio-ffmpeg is not installed" in proc.stderr
    ckpt = checkpoint.load_checkpoint(tmp_path / "trained" / "guarded" / "train" / "coarse.pt")
    assert (ckpt["iteration"], ckpt["render_backend"]) == (1, "torch")

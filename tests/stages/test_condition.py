import pytest

from chord.config import settings
from chord.guidance import text, tiny_models
from chord.resources.job_size import condition_gpus
from chord.stages import condition


def encode(out, guidance, method=None, *, prompt="a plant sways", n_prompt=".", env=None):
    """``condition.run`` of scene "s" (the default method unless ``method``)."""
    return condition.run(
        out=out,
        prompt=prompt,
        n_prompt=n_prompt,
        guidance=guidance,
        method=method or settings.method_from_mapping({}),
        scene="s",
        env=env,
    )


def test_condition_with_the_seeded_tiny_encoder(tmp_path):
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    meta = encode(tmp_path / "text.safetensors", guidance, prompt="a block hops")
    tensors, saved = text.read(tmp_path / "text.safetensors")
    assert tensors["prompt"].shape == (512, tiny_models.TINY_TEXT_DIM)
    assert saved["encoder"].startswith("tiny random umt5 (seed 0")
    assert saved["negative_prompt"] == text.DEFAULT_NEGATIVE_PROMPT == meta["negative_prompt"]
    again = tmp_path / "again.safetensors"
    encode(again, guidance, prompt="a block hops")
    assert text.read(again)[0]["prompt"].equal(tensors["prompt"])  # seeded: reproducible


def test_condition_with_a_wan_folder(tmp_path):
    folder = tiny_models.write_tiny_wan(tmp_path / "wan")
    guidance = settings.guidance_from_mapping({"backend": "wan", "ckpt_dir": str(folder)})
    meta = encode(tmp_path / "t.safetensors", guidance, n_prompt="blurry")
    assert meta["encoder"] == f"umt5 from {folder}" and meta["negative_prompt"] == "blurry"


def test_wan_backend_without_a_folder_is_a_clear_error(tmp_path):
    guidance = settings.guidance_from_mapping({"backend": "wan"})
    with pytest.raises(ValueError, match="guidance.ckpt_dir: the wan backend needs"):
        encode(tmp_path / "t.safetensors", guidance, prompt="p")
    assert not (tmp_path / "t.safetensors").exists()


def test_the_job_takes_a_free_gpu_for_the_wan_encoder_and_hides_cuda_otherwise(
    tmp_path, monkeypatch
):
    """With the Wan folder's UMT5 on a GPU (t5_cpu false) the job asks for one GPU
    (chord.resources.job_size.condition_gpus, the rule's gpu resource) and, among several visible,
    takes a
    free one as a training does (a lock per GPU), narrowing its CUDA_VISIBLE_DEVICES; with
    t5_cpu, or the oracle's tiny encoder, it asks for none and empties CUDA_VISIBLE_DEVICES,
    so it never lands on a GPU a training holds."""
    from chord.resources import gpus

    monkeypatch.setattr(gpus, "default_lock_dir", lambda: tmp_path / "locks")
    folder = tiny_models.write_tiny_wan(tmp_path / "wan")
    wan = settings.guidance_from_mapping({"backend": "wan", "ckpt_dir": str(folder)})
    oracle = settings.guidance_from_mapping({"backend": "oracle"})
    on_gpu = settings.method_from_mapping({"t5_cpu": False})
    on_cpu = settings.method_from_mapping({"t5_cpu": True})
    assert condition_gpus(wan, on_gpu) == 1
    assert condition_gpus(wan, on_cpu) == condition_gpus(oracle, on_gpu) == 0

    # GPU 0 is held by a training: the condition job takes GPU 1
    with gpus.gpu_set(["0"], 1, tmp_path / "locks"):
        env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
        encode(tmp_path / "t.safetensors", wan, on_gpu, env=env)
        assert env["CUDA_VISIBLE_DEVICES"] == "1"
    metas = {}
    for guidance, method in ((wan, on_cpu), (oracle, on_gpu)):
        env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
        metas[guidance.backend] = encode(tmp_path / "t.safetensors", guidance, method, env=env)
        assert env["CUDA_VISIBLE_DEVICES"] == "" and metas[guidance.backend]["device"] == "cpu"
    # on the CPU the Wan encoder computes in float32 (bf16 only on a GPU)
    assert metas["wan"]["dtype"] == "float32"

import pytest

from chord import config as cc
from chord.guidance import text, tiny_models
from chord.stages import condition


def test_condition_with_the_seeded_tiny_encoder(tmp_path):
    method = cc.method_from_mapping({})
    guidance = cc.guidance_from_mapping({"backend": "oracle"})
    meta = condition.run(
        out=tmp_path / "text.safetensors",
        prompt="a block hops",
        n_prompt=".",
        guidance=guidance,
        method=method,
        scene="toy",
    )
    tensors, saved = text.read(tmp_path / "text.safetensors")
    assert tensors["prompt"].shape == (512, tiny_models.TINY_TEXT_DIM)
    assert saved["encoder"].startswith("tiny random umt5 (seed 0")
    assert saved["negative_prompt"] == text.DEFAULT_NEGATIVE_PROMPT == meta["negative_prompt"]
    again = tmp_path / "again.safetensors"
    condition.run(
        out=again,
        prompt="a block hops",
        n_prompt=".",
        guidance=guidance,
        method=method,
        scene="toy",
    )
    assert text.read(again)[0]["prompt"].equal(tensors["prompt"])  # seeded: reproducible


def test_condition_with_a_wan_folder(tmp_path):
    folder = tiny_models.write_tiny_wan(tmp_path / "wan")
    method = cc.method_from_mapping({})
    guidance = cc.guidance_from_mapping({"backend": "wan", "ckpt_dir": str(folder)})
    meta = condition.run(
        out=tmp_path / "t.safetensors",
        prompt="a plant sways",
        n_prompt="blurry",
        guidance=guidance,
        method=method,
        scene="s",
    )
    assert meta["encoder"] == f"umt5 from {folder}" and meta["negative_prompt"] == "blurry"


def test_wan_backend_without_a_folder_is_a_clear_error(tmp_path):
    guidance = cc.guidance_from_mapping({"backend": "wan"})
    with pytest.raises(ValueError, match="guidance.ckpt_dir: the wan backend needs"):
        condition.run(
            out=tmp_path / "t.safetensors",
            prompt="p",
            n_prompt=".",
            guidance=guidance,
            method=cc.method_from_mapping({}),
            scene="s",
        )
    assert not (tmp_path / "t.safetensors").exists()

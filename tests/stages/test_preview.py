"""The teacher preview (`snakemake preview`): the oracle's scripted target video, and Wan 2.2
through diffusers' image-to-video pipeline with our experts and cached conditioning."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from chord import config as cc
from chord import demo, media, paths, runs
from chord.guidance import text, tiny_models, wan
from chord.stages import condition, preview, reference

W, H, T = 48, 32, 5


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    root = tmp_path_factory.mktemp("preview")
    data = demo.write_demo_scene("hop", root / "data", frame_num=T)
    m = cc.method_from_mapping(
        {"gs_init_num": 600, "surface_target_num": 200, "cp_num": 8, "size": f"{W}*{H}"}
        | {"frame_num": T, "save_fps": 5}
    )
    res, s = root / "results", "hop"
    out = runs.prepare_geometry(data=data, results=res, scene=s, method=m)
    reference.run(
        scene_json=paths.scene_json(res, s),
        plys=out["plys"],
        out_png=paths.reference_png(res, s),
        out_orbit=paths.static_orbit_mp4(res, s),
        method=m,
    )
    return root, data, m, res, s, out["plys"]


def test_the_oracle_previews_its_scripted_target_video(hop):
    root, data, m, res, s, plys = hop
    summary = preview.run(
        scene_json=paths.scene_json(res, s),
        plys=plys,
        ref_png=paths.reference_png(res, s),
        text_path=None,
        data_dir=data,
        method=m,
        guidance=cc.guidance_from_mapping({"backend": "oracle"}),
        settings=cc.PreviewConfig(),
        out_mp4=paths.teacher_mp4(res, s),
        out_png=paths.teacher_png(res, s),
    )
    frames, meta = media.read_mp4(paths.teacher_mp4(res, s))
    assert frames.shape == (T, H, W, 3) and meta["fps"] == 5 and summary["frames"] == T
    ref = np.asarray(Image.open(paths.reference_png(res, s)), dtype=np.float64)
    first, last = frames[0].astype(np.float64), frames[-1].astype(np.float64)

    def changed(a, b):  # the fraction of pixels that differ clearly (not by video coding)
        return float((np.abs(a - b).max(-1) > 40).mean())

    # frame 0 is the rest pose, the reference render; the last frame has moved
    assert changed(first, ref) < 0.002 < changed(last, first)
    with Image.open(paths.teacher_png(res, s)) as im:
        assert im.size == (3 * W, H)


def test_wan_previews_through_the_diffusers_pipeline_with_our_experts(hop, tmp_path, monkeypatch):
    from diffusers import WanImageToVideoPipeline

    root, data, m, res, s, plys = hop
    folder = tiny_models.write_tiny_wan(tmp_path / "wan")
    guidance = cc.guidance_from_mapping({"backend": "wan", "ckpt_dir": str(folder)})
    cond = tmp_path / "text.safetensors"
    condition.run(
        out=cond, prompt="a block hops", n_prompt=".", guidance=guidance, method=m, scene=s
    )
    loaded, calls = [], []
    load = wan.load_expert

    def counting_load(ckpt_dir, name, *, dtype):
        model = load(ckpt_dir, name, dtype=dtype)
        loaded.append((name, model))
        return model

    call = WanImageToVideoPipeline.__call__

    def spy(pipe, **kw):
        calls.append((pipe, kw))
        return call(pipe, **kw)

    monkeypatch.setattr(wan, "load_expert", counting_load)
    monkeypatch.setattr(WanImageToVideoPipeline, "__call__", spy)
    settings = cc.PreviewConfig(steps=2, guidance_scale=2.0, seed=3)
    preview.run(
        scene_json=paths.scene_json(res, s),
        plys=plys,
        ref_png=paths.reference_png(res, s),
        text_path=cond,
        data_dir=data,
        method=m,
        guidance=guidance,
        settings=settings,
        out_mp4=tmp_path / "teacher.mp4",
        out_png=tmp_path / "teacher.png",
    )
    [(pipe, kw)] = calls
    experts = dict(loaded)
    assert pipe.transformer is experts["transformer"]  # high noise
    assert pipe.transformer_2 is experts["transformer_2"]  # low noise
    assert pipe.config.boundary_ratio == 0.9  # the folder's model_index.json
    cached, _ = text.read(cond)
    torch.testing.assert_close(kw["prompt_embeds"][0], cached["prompt"])
    torch.testing.assert_close(kw["negative_prompt_embeds"][0], cached["negative"])
    assert (kw["num_frames"], kw["height"], kw["width"]) == (T, H, W)
    assert (kw["num_inference_steps"], kw["guidance_scale"]) == (2, 2.0)
    assert kw["image"].size == (W, H)  # the reference render
    frames, _ = media.read_mp4(tmp_path / "teacher.mp4")
    assert frames.shape == (T, H, W, 3)

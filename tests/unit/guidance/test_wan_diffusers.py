"""The Wan path tied to diffusers' own Wan 2.2 image-to-video sampler on the tiny random Wan
folder: the x̂0 that ``rfsds.sds_grad`` implies is the flow-prediction conversion of the
folder's scheduler (UniPC, ``prediction_type: flow_prediction``, as WanImageToVideoPipeline
samples with), ``WanGuidance.condition`` is ``WanImageToVideoPipeline.prepare_latents``'s image
condition, and a 3-step pipeline run, recorded with hooks, is reproduced step by step by
``expert_name`` and ``velocity`` at the same inputs."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from chord.guidance import rfsds, text, tiny_models, wan, wan_folder

T = 5  # 4k + 1 frames: 2 latent frames
W, H = 32, 16
STEPS = 3  # flow shift 5: timesteps 999, 909 (high-noise expert), 714 (low-noise expert)
CFG_HIGH, CFG_LOW = 4.0, 2.5  # the pipeline's guidance_scale and guidance_scale_2
U = torch.finfo(torch.float32).eps / 2  # unit roundoff of float32


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_models.write_tiny_wan(tmp_path_factory.mktemp("wan") / "Wan2.2-I2V-A14B-Tiny")


def prompt_embeddings(folder) -> dict[str, torch.Tensor]:
    """The folder's text encoder on a prompt and the default negative prompt."""
    tok, enc = wan_folder.load_text_encoder(folder)
    e, _ = text.encode_prompts(tok, enc, ["a block hops", text.resolve_negative(".")])
    return {"prompt": e[0], "negative": e[1]}


def diffusers_pipeline(folder):
    """diffusers' own WanImageToVideoPipeline over the folder's parts, both experts in float32
    (prompt embeddings passed in: no text encoder)."""
    from diffusers import WanImageToVideoPipeline

    return WanImageToVideoPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=wan_folder.load_vae(folder),
        scheduler=wan_folder.load_scheduler(folder),
        transformer=wan_folder.load_expert(folder, "transformer", dtype=torch.float32),
        transformer_2=wan_folder.load_expert(folder, "transformer_2", dtype=torch.float32),
        boundary_ratio=0.9,
    )


@pytest.fixture(scope="module")
def embeddings(folder):
    return prompt_embeddings(folder)


@pytest.fixture(scope="module")
def pipe(folder):
    return diffusers_pipeline(folder)


def frame0(seed=0) -> torch.Tensor:
    """An 8-bit image [3, H, W] in [0, 1] (exactly what a PIL image of it holds)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, H, W), generator=g).float() / 255.0


def test_the_image_condition_is_the_pipelines(folder, pipe):
    """METHOD §9: y = concat(mask, normalised VAE mean of [I₀, 0, …, 0]) is what
    prepare_latents builds from the same image (given in [-1, 1], as its preprocessor gives
    it). The latents are the same VAE pass; only the normalisation differs in rounding:
    ours divides by σ_c, diffusers multiplies by 1/σ_c (≤ 2 roundings of the result)."""
    guidance = wan.WanGuidance(folder)
    video = torch.zeros(T, 3, H, W)
    video[0] = frame0()
    video[1:] = torch.rand(T - 1, 3, H, W)  # the condition sees frame 0 only
    y = guidance.condition(video)
    image = (video[0] * 2.0 - 1.0)[None]
    _, cond = pipe.prepare_latents(
        image, 1, 16, H, W, T, torch.float32, torch.device("cpu"), latents=torch.zeros(1)
    )
    assert cond.shape == (1, *y.shape) == (1, 20, 2, H // 8, W // 8)
    assert torch.equal(cond[0, :4], y[:4])  # the first-frame mask
    torch.testing.assert_close(cond[0, 4:], y[4:], rtol=4 * U, atol=0.0)


def run_recorded(pipe, embeddings, folder):
    """A STEPS-step sample of the pipeline, recording per step the expert that ran, its
    input (z_t | y), the timestep, the guided noise prediction the scheduler stepped with,
    and the scheduler's flow-prediction conversion at that step of our own (z, ε, t = σ)."""
    steps: list[dict] = []
    hooks = []
    for name in ("transformer", "transformer_2"):

        def pre(module, args, kwargs, name=name):
            step = steps[-1] if steps and "noise_pred" not in steps[-1] else None
            if step is None:  # the step's conditional pass (the unconditional one follows)
                steps.append(
                    {
                        "expert": name,
                        "input": kwargs["hidden_states"].clone(),
                        "timestep": kwargs["timestep"].clone(),
                    }
                )
            else:
                assert step["expert"] == name  # both passes of a step run one expert

        hooks.append(getattr(pipe, name).register_forward_pre_hook(pre, with_kwargs=True))
    sched = pipe.scheduler
    convert, step_fn = sched.convert_model_output, sched.step
    g = torch.Generator().manual_seed(7)

    def recording_convert(model_output, *args, sample=None, **kwargs):
        rec = steps[-1]
        sigma = float(sched.sigmas[sched.step_index])
        z = torch.randn(model_output.shape, generator=g)
        eps = torch.randn(model_output.shape, generator=g)
        z_t = rfsds.noisy_latents(z, eps, sigma)
        rec.update(sigma=sigma, z=z, eps=eps, x0=convert(model_output, sample=z_t))
        return convert(model_output, *args, sample=sample, **kwargs)

    def recording_step(model_output, timestep, sample, *args, **kwargs):
        steps[-1].update(noise_pred=model_output.clone(), step_timestep=timestep)
        return step_fn(model_output, timestep, sample, *args, **kwargs)

    sched.convert_model_output, sched.step = recording_convert, recording_step
    try:
        image = Image.fromarray((frame0() * 255).round().byte().permute(1, 2, 0).numpy())
        pipe(
            image=image,
            prompt_embeds=embeddings["prompt"][None],
            negative_prompt_embeds=embeddings["negative"][None],
            height=H,
            width=W,
            num_frames=T,
            num_inference_steps=STEPS,
            guidance_scale=CFG_HIGH,
            guidance_scale_2=CFG_LOW,
            generator=torch.Generator().manual_seed(0),
            output_type="latent",
        )
    finally:
        for h in hooks:
            h.remove()
        del sched.convert_model_output, sched.step  # the class's methods again
    return steps


@pytest.fixture(scope="module")
def recorded(pipe, embeddings, folder):
    return run_recorded(pipe, embeddings, folder)


def test_a_recorded_pipeline_run_covers_both_experts(recorded):
    assert [r["expert"] for r in recorded] == ["transformer", "transformer", "transformer_2"]
    assert [int(r["timestep"][0]) for r in recorded] == [999, 909, 714]


def test_expert_name_and_velocity_reproduce_each_pipeline_step(folder, recorded, embeddings):
    """At the pipeline's inputs (z_t, y, its timestep k as t = k/1000, the CFG scale of the
    step's expert) ``velocity`` returns the pipeline's guided noise prediction. Run as the
    pipeline runs it (conditional, then unconditional pass) it is the same float32 arithmetic
    bit for bit; batched (``sds_cfg_batch``, the default) the two passes share one DiT call,
    whose float32 sums may be ordered differently: agreement to ~1e-6 of the outputs."""
    sequential = wan.WanGuidance(folder, sds_cfg_batch=False)
    batched = wan.WanGuidance(folder)
    for rec in recorded:
        t = float(rec["timestep"][0]) / wan.NUM_TRAIN_TIMESTEPS
        assert sequential.expert_name(t) == rec["expert"]
        x = rec["input"]
        z_t, y = x[:, :16], x[0, 16:]
        scale = CFG_HIGH if rec["expert"] == "transformer" else CFG_LOW
        v = sequential.velocity(z_t, t, [y], embeddings, scale)
        assert torch.equal(v, rec["noise_pred"]), rec["expert"]
        v = batched.velocity(z_t, t, [y], embeddings, scale)
        size = rec["noise_pred"].abs().max()
        torch.testing.assert_close(v, rec["noise_pred"], rtol=0.0, atol=float(64 * U * size))


def test_sds_grad_implies_the_schedulers_flow_prediction_x0(recorded):
    """METHOD §11: g = w·(v̂ − (ε − z)) with z_t = (1 − t)·z + t·ε is w·(z − x̂0)/t, where
    x̂0 = z_t − t·v̂ is the scheduler's own flow-prediction conversion at σ = t. Recovered
    as z − t·g/w, it equals the scheduler's up to float32 rounding: each of the ~11 rounded
    operations of the two computations errs by at most U times an operand, and every operand
    is bounded by |z| + |ε| + |v̂| (t, 1 − t ≤ 1, w near 1): 16·U·(|z| + |ε| + |v̂|) per entry."""
    w = 0.75
    for rec in recorded:
        z, eps, v, t = rec["z"], rec["eps"], rec["noise_pred"], rec["sigma"]
        g = rfsds.sds_grad(z, eps, v, w)
        implied = z - t * g / w
        bound = 16 * U * (z.abs() + eps.abs() + v.abs())
        err = (implied - rec["x0"]).abs()
        assert bool((err <= bound).all()), (rec["expert"], float((err - bound).max()))
        # and not by accident: the wrong sign convention (v = z − ε) is far off
        wrong = z - t * (-(v + eps - z))
        assert float((wrong - rec["x0"]).abs().max()) > 1e3 * float(bound.max())

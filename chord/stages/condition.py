"""Stage ``condition`` (METHOD §9): the prompt's and negative prompt's UMT5 embeddings,
cached once per scene in ``condition/text.safetensors`` so training never loads the text
encoder. With ``guidance.ckpt_dir`` the Wan folder's UMT5 encodes them; without one (the
oracle demo) a small seeded UMT5 built from a config runs the same code path, and the file's
metadata says so.

The job uses a GPU only where it asks for one (:func:`gpus`, the rule's ``gpu`` resource): the
Wan folder's UMT5 (~11 GB in bf16) encodes on a GPU unless ``method.t5_cpu``; it then takes a
free GPU the way a training does (:func:`chord.resources.gpus.job_gpu`), and otherwise hides CUDA,
so it
never lands on a GPU a training is using."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from pathlib import Path

import torch

from chord.config.result_keys import guidance_config, stage_config
from chord.core.errors import InputError
from chord.guidance import text
from chord.resources.gpus import job_gpu
from chord.resources.job_size import condition_gpus

logger = logging.getLogger(__name__)

TINY_SEED = 0


def text_encoder_for(guidance, device: str = "cpu"):
    """(tokenizer, encoder, description) for the configured guidance; the Wan folder's UMT5 on
    ``device`` (bf16 on CUDA, float32 on the CPU)."""
    if guidance.ckpt_dir:
        from chord.guidance import wan_folder

        dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
        tokenizer, encoder = wan_folder.load_text_encoder(
            guidance.ckpt_dir, device=device, dtype=dtype
        )
        return tokenizer, encoder, f"umt5 from {guidance.ckpt_dir}"
    if guidance.backend == "wan":
        raise InputError(
            "guidance.ckpt_dir: the wan backend needs the Wan2.2-I2V-A14B-Diffusers "
            "folder (set guidance.ckpt_dir in the config)"
        )
    from chord.guidance import tiny_models

    tokenizer, encoder = tiny_models.tiny_text_encoder(TINY_SEED)
    return (
        tokenizer,
        encoder,
        (
            f"tiny random umt5 (seed {TINY_SEED}, d_model "
            f"{tiny_models.TINY_TEXT_DIM}): oracle demo, not a real encoder"
        ),
    )


def run(
    *,
    out: Path,
    prompt: str,
    n_prompt: str,
    guidance,
    method,
    scene: str,
    env: MutableMapping[str, str] | None = None,
) -> dict:
    """Encode the scene's prompts into ``out``; returns the file's metadata.

    ``env``: the job's environment (the workflow's condition job passes ``os.environ``, before
    CUDA starts). With :func:`gpus` 1 it takes a free GPU among several and narrows
    ``CUDA_VISIBLE_DEVICES`` to it (:func:`chord.resources.gpus.job_gpu`; one GPU or none visible:
    as it
    is); with 0 it empties ``CUDA_VISIBLE_DEVICES``, so the process takes no GPU it did not ask
    for. None (``chord train``, which trains on in the same process): the environment stays as
    it is and the GPU is used where one is visible and ``t5_cpu`` is false."""
    method, guidance = stage_config(method, "condition"), guidance_config(guidance, "condition")
    negative = text.resolve_negative(n_prompt)
    if env is None:
        cuda = bool(condition_gpus(guidance, method)) and torch.cuda.is_available()
        return _encode(out, prompt, n_prompt, negative, guidance, scene, cuda)
    if not condition_gpus(guidance, method):
        env["CUDA_VISIBLE_DEVICES"] = ""  # asked for no GPU: take none
        return _encode(out, prompt, n_prompt, negative, guidance, scene, cuda=False)
    with job_gpu(env):
        cuda = torch.cuda.is_available()
        return _encode(out, prompt, n_prompt, negative, guidance, scene, cuda)


def _encode(out, prompt, n_prompt, negative, guidance, scene, cuda: bool) -> dict:
    device = "cuda" if cuda else "cpu"
    tokenizer, encoder, source = text_encoder_for(guidance, device)
    embeds, lengths = text.encode_prompts(tokenizer, encoder, [prompt, negative])
    meta = {
        "scene": scene,
        "prompt": prompt,
        "negative_prompt": negative,
        "n_prompt": n_prompt,
        "encoder": source,
        "backend": guidance.backend,
        "prompt_tokens": int(lengths[0]),
        "negative_tokens": int(lengths[1]),
        "dim": int(embeds.shape[-1]),
        "device": device,
        "dtype": str(next(encoder.parameters()).dtype).removeprefix("torch."),
    }
    text.write(out, prompt=embeds[0], negative=embeds[1], meta=meta)
    logger.info(
        "%s: %d/%d prompt/negative tokens, %s, on %s",
        scene,
        meta["prompt_tokens"],
        meta["negative_tokens"],
        source,
        device if not cuda else f"cuda ({torch.cuda.get_device_name()})",
    )
    return meta

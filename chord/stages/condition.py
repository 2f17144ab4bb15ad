"""Stage ``condition`` (METHOD §9): the prompt's and negative prompt's UMT5 embeddings,
cached once per scene in ``condition/text.safetensors`` so training never loads the text
encoder. With ``guidance.ckpt_dir`` the Wan folder's UMT5 encodes them; without one (the
oracle demo) a small seeded UMT5 built from a config runs the same code path, and the file's
metadata says so."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from chord.errors import InputError
from chord.guidance import text

logger = logging.getLogger(__name__)

TINY_SEED = 0


def text_encoder_for(guidance, method):
    """(tokenizer, encoder, description) for the configured guidance."""
    if guidance.ckpt_dir:
        from chord.guidance import wan

        use_gpu = torch.cuda.is_available() and not method.t5_cpu
        device = "cuda" if use_gpu else "cpu"
        dtype = torch.bfloat16 if use_gpu else torch.float32
        tokenizer, encoder = wan.load_text_encoder(guidance.ckpt_dir, device=device, dtype=dtype)
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


def run(*, out: Path, prompt: str, n_prompt: str, guidance, method, scene: str) -> dict:
    negative = text.resolve_negative(n_prompt)
    tokenizer, encoder, source = text_encoder_for(guidance, method)
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
    }
    text.write(out, prompt=embeds[0], negative=embeds[1], meta=meta)
    logger.info(
        "%s: %d/%d prompt/negative tokens, %s",
        scene,
        meta["prompt_tokens"],
        meta["negative_tokens"],
        source,
    )
    return meta

"""Text conditioning (METHOD §9): UMT5 embeddings of the prompt and the negative prompt,
computed once per scene and cached, so training never loads the text encoder."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError

logger = logging.getLogger(__name__)

TEXT_LEN = 512
FORMAT = "chord-text/1"
# Wan's standard negative prompt (Wan 2.1/2.2 shared config), verbatim; used for n_prompt "."
# or "" as in the release.
DEFAULT_NEGATIVE_PROMPT = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，"
    "低质量，JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，"
    "形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)


def resolve_negative(n_prompt: str | None) -> str:
    """METHOD §9: "." or "" (or None) means Wan's default negative prompt."""
    return DEFAULT_NEGATIVE_PROMPT if n_prompt in (None, "", ".") else n_prompt


def clean(prompt: str) -> str:
    """The Wan pipeline's prompt cleaning (ftfy, HTML unescape, whitespace)."""
    from diffusers.pipelines.wan.pipeline_wan_i2v import prompt_clean

    return prompt_clean(prompt)


@torch.no_grad()
def encode_prompts(
    tokenizer, text_encoder, prompts: list[str], *, max_length: int = TEXT_LEN
) -> tuple[Tensor, Tensor]:
    """UMT5 embeddings [B, 512, D] of cleaned prompts: the real tokens' last hidden states,
    zero-padded to ``max_length`` (as diffusers' Wan pipeline does), and their lengths [B]."""
    batch = tokenizer(
        [clean(p) for p in prompts],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    device = next(text_encoder.parameters()).device
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    hidden = text_encoder(ids, mask).last_hidden_state.float().cpu()  # [B, L, D]
    lengths = mask.gt(0).sum(1).cpu()
    keep = torch.arange(max_length)[None, :, None] < lengths[:, None, None]
    return torch.where(keep, hidden, 0.0), lengths


def write(path: Path | str, *, prompt: Tensor, negative: Tensor, meta: dict) -> None:
    """``text.safetensors``: tensors "prompt" and "negative" [512, D] float32, JSON metadata."""
    tensors = {"prompt": prompt.float().contiguous(), "negative": negative.float().contiguous()}
    with atomic_path(path, suffix=".safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"chord": json.dumps({"format": FORMAT, **meta})})


def read(path: Path | str) -> tuple[dict[str, Tensor], dict]:
    """Load cached text embeddings: ({"prompt", "negative"}, metadata)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("chord", "{}"))
            tensors = {k: f.get_tensor(k) for k in ("prompt", "negative")}
    except (OSError, SafetensorError, json.JSONDecodeError, KeyError) as exc:
        raise InputError(f"{path}: not a readable text-conditioning file ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise InputError(f"{path}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    return tensors, meta

"""The diffusers-format Wan 2.2 I2V folder (METHOD §9): its check and its components'
loaders, local files only (nothing is ever fetched from a hub)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from chord.core.errors import InputError

logger = logging.getLogger(__name__)

COMPONENTS = ("transformer", "transformer_2", "vae", "text_encoder", "tokenizer")
_WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
_TOKENIZER = ("tokenizer.json", "spiece.model", "tokenizer_config.json")


def check_folder(ckpt_dir: Path | str, components=COMPONENTS) -> dict:
    """Validate a diffusers-format Wan 2.2 I2V folder; return its model_index.json.

    A missing folder, index or component (config or weights) is a ValueError that names the
    folder and lists everything missing.
    """
    folder = Path(ckpt_dir)
    if not folder.is_dir():
        raise InputError(
            f"guidance.ckpt_dir {folder}: folder not found (expected a "
            "diffusers-format Wan2.2-I2V-A14B-Diffusers folder)"
        )
    missing = []
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        missing.append("model_index.json")
    for comp in components:
        sub = folder / comp
        if comp == "tokenizer":
            if not any((sub / f).is_file() for f in _TOKENIZER):
                missing.append("tokenizer/ (tokenizer.json or spiece.model)")
            continue
        if not (sub / "config.json").is_file():
            missing.append(f"{comp}/config.json")
        if not any(any(sub.glob(p)) for p in _WEIGHTS):
            missing.append(f"{comp}/ weights (*.safetensors)")
    if missing:
        raise InputError(
            f"guidance.ckpt_dir {folder}: incomplete Wan 2.2 I2V folder; missing: "
            + ", ".join(missing)
        )
    return json.loads(index_path.read_text())


def load_text_encoder(ckpt_dir: Path | str, *, device="cpu", dtype=torch.float32):
    """(tokenizer, UMT5 encoder) from the folder, local files only."""
    from transformers import AutoTokenizer, UMT5EncoderModel

    folder = Path(ckpt_dir)
    check_folder(folder, ("text_encoder", "tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    encoder = UMT5EncoderModel.from_pretrained(
        folder / "text_encoder", local_files_only=True, torch_dtype=dtype
    )
    return tokenizer, encoder.to(device).eval().requires_grad_(False)


def load_vae(ckpt_dir: Path | str, *, device="cpu"):
    """The Wan 2.1 VAE (float32, frozen)."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(
        Path(ckpt_dir) / "vae", local_files_only=True, torch_dtype=torch.float32
    )
    return vae.to(device).eval().requires_grad_(False)


def load_expert(ckpt_dir: Path | str, name: str, *, dtype):
    """One DiT expert on the CPU (frozen, eval mode)."""
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(
        Path(ckpt_dir) / name, local_files_only=True, torch_dtype=dtype
    )
    return model.eval().requires_grad_(False)


def load_scheduler(ckpt_dir: Path | str):
    """The folder's sampling scheduler (``scheduler/scheduler_config.json``: its class and
    settings); without one, Wan 2.2 A14B's: UniPC over flow sigmas with shift 5.0."""
    import diffusers

    folder = Path(ckpt_dir) / "scheduler"
    config = folder / "scheduler_config.json"
    if config.is_file():
        cls = getattr(diffusers, json.loads(config.read_text())["_class_name"])
        return cls.from_pretrained(folder, local_files_only=True)
    logger.warning("%s: no scheduler; using UniPC flow sampling with shift 5.0", folder)
    return diffusers.UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0
    )

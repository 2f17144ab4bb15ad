"""Tiny, randomly initialised Wan 2.2 components built from their diffusers / transformers
configs (DESIGN §4). They run the real loading, conditioning, expert-routing and CFG code on
a CPU; the demo's ``condition`` stage uses the seeded tiny UMT5 when no weights are given.

Weights are drawn under a forked RNG seeded with ``seed``: deterministic, and the caller's
global RNG state is left untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_TEXT_DIM = 32
_CORPUS = [
    "a toy block hops forward across the table and turns as it lands",
    "a green plant sways from side to side in the wind",
    "a colourful block twists back and forth and slides a little",
    "the object moves smoothly, bends, jumps, rotates, falls, rises, waves and spins",
    "static frame, blurry details, worst quality, low quality, subtitles, style, artwork",
]


def tiny_tokenizer():
    """A byte-level BPE tokenizer trained in memory on a few sentences (any text encodes),
    wrapped as a transformers fast tokenizer with T5's specials (pad 0, </s> 1, <unk> 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=512,
    )


def _seeded(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def tiny_umt5(vocab_size: int, *, seed: int = 0, d_model: int = TINY_TEXT_DIM):
    """A 2-layer UMT5 encoder (d_model 32) with seeded random weights, in eval mode."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return _seeded(seed, lambda: UMT5EncoderModel(config)).eval()


def tiny_text_encoder(seed: int = 0):
    """(tokenizer, UMT5 encoder): the seeded tiny pair the oracle demo encodes prompts with."""
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_umt5(len(tokenizer), seed=seed)


def tiny_transformer(*, seed: int = 0, text_dim: int = TINY_TEXT_DIM):
    """A one-block Wan transformer with Wan 2.2 I2V's interface: 36 input channels (16 noisy
    latents | 4 mask | 16 image latents), 16 output channels, patch 1×2×2."""
    from diffusers import WanTransformer3DModel

    return _seeded(
        seed,
        lambda: WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=8,
            in_channels=36,
            out_channels=16,
            text_dim=text_dim,
            freq_dim=32,
            ffn_dim=32,
            num_layers=1,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            image_dim=None,
            rope_max_seq_len=64,
        ),
    ).eval()


def tiny_vae(*, seed: int = 0):
    """A small AutoencoderKLWan (16 latent channels, stride 4×8×8) with random weights."""
    from diffusers import AutoencoderKLWan

    return _seeded(
        seed,
        lambda: AutoencoderKLWan(
            base_dim=8,
            z_dim=16,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
        ),
    ).eval()


def write_tiny_wan(folder: Path | str, *, seed: int = 0, boundary_ratio: float = 0.9) -> Path:
    """A complete diffusers-format Wan2.2-I2V-A14B-shaped folder of tiny random components:
    model_index.json, transformer (high noise), transformer_2 (low noise), vae, text_encoder,
    tokenizer, scheduler. Returns the folder."""
    folder = Path(folder)
    tokenizer, encoder = tiny_text_encoder(seed)
    tokenizer.save_pretrained(folder / "tokenizer")
    encoder.save_pretrained(folder / "text_encoder")
    tiny_transformer(seed=seed + 1).save_pretrained(folder / "transformer")
    tiny_transformer(seed=seed + 2).save_pretrained(folder / "transformer_2")
    tiny_vae(seed=seed + 3).save_pretrained(folder / "vae")
    from diffusers import UniPCMultistepScheduler

    UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0
    ).save_pretrained(folder / "scheduler")
    index = {
        "_class_name": "WanImageToVideoPipeline",
        "boundary_ratio": boundary_ratio,
        "expand_timesteps": False,
        "image_encoder": [None, None],
        "image_processor": [None, None],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    }
    (folder / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return folder


def fitted_tiny_vae(vae, *, normalized: bool, seed: int = 0):
    """A Tiny VAE encoder that approximates ``vae`` (an AutoencoderKLWan) in one latent
    convention: raw Wan 2.1 latents (``normalized`` False, what ``lighttaew2_1`` emits) or
    latents already normalised per channel with the VAE config's ``latents_mean`` /
    ``latents_std`` (True, what ``taew2_1`` emits). A random encoder approximates neither, so
    the latent-scale check (:mod:`chord.guidance.tiny_vae_check`) could tell nothing from it.

    Layers 0-16 keep seeded random weights; the last convolution (``encoder.17``) is fitted by
    (ridge-regularised) least squares, on its centre tap and bias, to the VAE's posterior
    means of 12 still clips of smooth random images (5 frames, 64x64: 1,536 latent positions
    for 65 unknowns per channel), with the VAE's own [-1, 1] input and the encoder's [0, 1]."""
    from chord.guidance.tiny_vae import LATENT_CHANNELS, WIDTH, TinyVAEEncoder

    def build():
        g = torch.Generator().manual_seed(seed)
        small = torch.rand(12, 3, 8, 8, generator=g)
        images = torch.nn.functional.interpolate(small, size=(64, 64), mode="bilinear")
        return TinyVAEEncoder(), images[:, None].expand(12, 5, 3, 64, 64)

    tiny, clips = _seeded(seed, build)
    head = tiny.encoder[17]
    features = []
    hook = head.register_forward_hook(lambda module, args, out: features.append(args[0]))
    with torch.no_grad():
        try:
            tiny(clips)
        finally:
            hook.remove()
        z = vae.encode((clips * 2.0 - 1.0).permute(0, 2, 1, 3, 4)).latent_dist.mean
        if normalized:
            shape = (1, LATENT_CHANNELS, 1, 1, 1)
            mean = torch.tensor(vae.config.latents_mean).view(shape)
            z = (z - mean) / torch.tensor(vae.config.latents_std).view(shape)
        x = features[0].permute(0, 2, 3, 1).reshape(-1, WIDTH).double()  # [N·T'·h·w, 64]
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
        y = z.permute(0, 2, 3, 4, 1).reshape(-1, LATENT_CHANNELS).double()  # same order
        # ridge-regularised normal equations: random ReLU features are nearly collinear, and
        # a plain least-squares solve would pick among near-equal fits by rounding noise
        gram = x.T @ x
        ridge = 1e-6 * torch.diagonal(gram)[:WIDTH].mean()
        gram[:WIDTH, :WIDTH] += ridge * torch.eye(WIDTH, dtype=gram.dtype)
        solution = torch.linalg.solve(gram, x.T @ y)  # [65, 16]
        head.weight.zero_()
        head.weight[:, :, 1, 1] = solution[:WIDTH].T.float()
        head.bias.copy_(solution[WIDTH].float())
    return tiny


def write_tiny_vae(path: Path | str, ckpt_dir: Path | str, *, normalized: bool = False) -> Path:
    """:func:`fitted_tiny_vae` of the Wan folder ``ckpt_dir``'s VAE, saved at ``path``
    (safetensors, the encoder keys of the published file). Returns ``path``."""
    from safetensors.torch import save_file

    from chord.guidance import wan_folder

    path = Path(path)
    tiny = fitted_tiny_vae(wan_folder.load_vae(ckpt_dir), normalized=normalized)
    save_file(tiny.state_dict(), str(path))
    return path

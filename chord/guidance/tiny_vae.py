"""Tiny VAE encoder for Wan 2.1 latents (METHOD §10): TAEHV, ``lighttaew2_1`` layout.

With ``use_tiny_vae`` the video latents z of the rendered clip come from this encoder instead of
the full Wan VAE (the image condition y always uses the full VAE). The encoder is the TAEHV
"taew2_1" architecture: 2D convolutions applied per frame, MemBlocks that see the previous time
step, and temporal pools that fold consecutive steps into channels. Spatial /8, temporal /4,
16 latent channels. Its state-dict keys are those of the published ``lighttaew2_1`` file
(``encoder.*``; the ``decoder.*`` keys are ignored). It runs in float32, its parameters are
frozen, and nothing on its path is under no-grad: gradients reach the video.

Shapes: the encoder takes ``[N, T, 3, H, W]`` in [0, 1] (no [-1, 1] mapping), pads T at the end
to a multiple of 4 by repeating the last frame (41 -> 44 -> 11 latent frames) and returns raw
latents ``[N, T', 16, H/8, W/8]`` (``forward``). ``encode`` returns them channel-first as the
Wan VAE does, ``[N, 16, T', H/8, W/8]``, normalised per channel by default with Wan 2.1's
``latents_mean`` / ``latents_std``: (z - mu_c) / sigma_c. The statistics are a setting
(constructor arguments or ``set_latent_stats``), e.g. taken from a VAE config.

The latent-scale check against the full Wan VAE is :mod:`chord.guidance.tiny_vae_check`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from chord.core.errors import InputError

logger = logging.getLogger(__name__)

LATENT_CHANNELS = 16
SPATIAL_FACTOR = 8
TEMPORAL_FACTOR = 4
WIDTH = 64  # channels inside the encoder

# Wan 2.1 VAE latent statistics (diffusers AutoencoderKLWan config defaults).
WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916,
)  # fmt: skip

_RANGE_TOL = 1e-2  # video values this far outside [0, 1] are logged once

__all__ = [
    "LATENT_CHANNELS",
    "WAN21_LATENTS_MEAN",
    "WAN21_LATENTS_STD",
    "MemBlock",
    "TPool",
    "TinyVAEEncoder",
    "latent_stats_from_config",
    "load_tiny_vae",
]


# --------------------------------------------------------------------------------------------
# Blocks (frames stacked as N·T along the batch axis)
# --------------------------------------------------------------------------------------------


def _conv(c_in: int, c_out: int, **kw) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, **kw)


class MemBlock(nn.Module):
    """METHOD §10. Residual block with a one-step memory, on frames stacked as ``[N·T, C, H, W]``.

    ``past`` is this block's input at the previous time step (zeros at t = 0); the output is
    ReLU(body(cat[x_t, x_{t-1}]) + x_t) with body = conv(2c->c), ReLU, conv, ReLU, conv. The body
    is a per-frame conv, so all steps are computed at once from the sequence shifted by one step.
    """

    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Sequential(
            _conv(2 * c, c), nn.ReLU(inplace=True), _conv(c, c), nn.ReLU(inplace=True), _conv(c, c)
        )

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x: ``[N·T, C, H, W]`` (time-major within each clip), n = N -> ``[N·T, C, H, W]``."""
        nt, c, h, w = x.shape
        seq = x.reshape(n, nt // n, c, h, w)
        past = F.pad(seq[:, :-1], (0, 0, 0, 0, 0, 0, 1, 0))  # zeros at t = 0
        both = torch.cat([seq, past], dim=2).view(nt, 2 * c, h, w)
        return torch.relu_(self.conv(both) + x)


class TPool(nn.Module):
    """METHOD §10. Temporal pool: s consecutive steps folded into channels, then 1x1 conv s·c->c.

    ``[N·T, C, H, W]`` -> ``[N·T/s, C, H, W]``; the earlier step's channels come first.
    """

    def __init__(self, c: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(c * stride, c, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x: ``[N·T, C, H, W]`` with T a multiple of the stride -> ``[N·T/s, C, H, W]``."""
        nt, c, h, w = x.shape
        if (nt // n) % self.stride:
            raise ValueError(f"TPool: {nt // n} time steps is not a multiple of {self.stride}")
        return self.conv(x.reshape(nt // self.stride, c * self.stride, h, w))


def _stats_tensor(values, name: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=torch.float32).flatten()
    if t.numel() != LATENT_CHANNELS:
        raise ValueError(f"{name}: expected {LATENT_CHANNELS} values, got {t.numel()}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: values must be finite")
    return t


def latent_stats_from_config(config) -> tuple[list[float], list[float]]:
    """METHOD §10. ``latents_mean`` / ``latents_std`` ([16] each) from a VAE config.

    ``config`` is a mapping (e.g. the parsed ``vae/config.json``) or an object with those
    attributes (e.g. ``AutoencoderKLWan.config``).
    """
    get = config.get if isinstance(config, Mapping) else lambda k: getattr(config, k, None)
    mean, std = get("latents_mean"), get("latents_std")
    if mean is None or std is None:
        raise InputError("config: needs both latents_mean and latents_std")
    return list(map(float, mean)), list(map(float, std))


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------


class TinyVAEEncoder(nn.Module):
    """METHOD §10. TAEHV encoder for Wan 2.1 latents: ``[N, T, 3, H, W]`` -> ``[N, T', 16, h, w]``.

    ``encoder`` is an ``nn.Sequential`` whose indices match the ``lighttaew2_1`` keys
    (``encoder.0.weight`` ... ``encoder.17.bias``). Float32; parameters frozen when ``frozen``.
    ``latents_mean`` / ``latents_std`` ([16] each, default Wan 2.1) are used by ``encode``.
    """

    def __init__(
        self,
        *,
        latents_mean: Sequence[float] | None = None,
        latents_std: Sequence[float] | None = None,
        frozen: bool = True,
    ):
        super().__init__()
        c = WIDTH
        self.encoder = nn.Sequential(
            _conv(3, c),  # 0
            nn.ReLU(inplace=True),  # 1
            TPool(c, 2),  # 2
            _conv(c, c, stride=2, bias=False),  # 3
            MemBlock(c),  # 4
            MemBlock(c),  # 5
            MemBlock(c),  # 6
            TPool(c, 2),  # 7
            _conv(c, c, stride=2, bias=False),  # 8
            MemBlock(c),  # 9
            MemBlock(c),  # 10
            MemBlock(c),  # 11
            TPool(c, 1),  # 12
            _conv(c, c, stride=2, bias=False),  # 13
            MemBlock(c),  # 14
            MemBlock(c),  # 15
            MemBlock(c),  # 16
            _conv(c, LATENT_CHANNELS),  # 17
        )
        # not persistent: the state dict holds exactly the published encoder keys
        self.register_buffer("latents_mean", torch.zeros(LATENT_CHANNELS), persistent=False)
        self.register_buffer("latents_std", torch.ones(LATENT_CHANNELS), persistent=False)
        self.set_latent_stats(
            WAN21_LATENTS_MEAN if latents_mean is None else latents_mean,
            WAN21_LATENTS_STD if latents_std is None else latents_std,
        )
        self._warned_range = False
        if frozen:
            self.requires_grad_(False)

    def set_latent_stats(self, latents_mean, latents_std) -> None:
        """METHOD §10. Replace the per-channel normalisation statistics ([16] each, std > 0)."""
        mean = _stats_tensor(latents_mean, "latents_mean")
        std = _stats_tensor(latents_std, "latents_std")
        if (std <= 0).any():
            raise ValueError("latents_std: values must be > 0")
        self.latents_mean.copy_(mean)
        self.latents_std.copy_(std)

    def _check_video(self, video: torch.Tensor) -> torch.Tensor:
        if not isinstance(video, torch.Tensor) or video.dim() != 5 or video.shape[2] != 3:
            shape = tuple(video.shape) if isinstance(video, torch.Tensor) else type(video)
            raise ValueError(f"video: expected [N, T, 3, H, W], got {shape}")
        n, t, _, h, w = video.shape
        if n < 1 or t < 1:
            raise ValueError(
                f"video: needs at least one clip and one frame, got {tuple(video.shape)}"
            )
        if h % SPATIAL_FACTOR or w % SPATIAL_FACTOR or h == 0 or w == 0:
            raise ValueError(f"video: H and W must be positive multiples of 8, got {h}x{w} (HxW)")
        if not video.is_floating_point():
            raise ValueError(f"video: expected floats in [0, 1], got {video.dtype}")
        weight = self.encoder[0].weight
        if video.device != weight.device:
            raise ValueError(f"video: on {video.device}, the encoder is on {weight.device}")
        if not self._warned_range:
            with torch.no_grad():
                lo, hi = torch.aminmax(video)
            if lo.item() < -_RANGE_TOL or hi.item() > 1 + _RANGE_TOL:
                self._warned_range = True
                logger.warning(
                    "tiny VAE input spans [%.3f, %.3f]; it expects [0, 1] (no [-1, 1] mapping)",
                    lo.item(),
                    hi.item(),
                )
        return video.to(weight.dtype)

    def forward(self, video: torch.Tensor, *, checkpoint: bool = False) -> torch.Tensor:
        """METHOD §10. Raw latents: video ``[N, T, 3, H, W]`` in [0, 1] -> ``[N, T', 16, h, w]``.

        T' = ceil(T/4) (T padded at the end by repeating the last frame), h, w = H/8, W/8.
        ``checkpoint`` (the ``checkpoint_tiny_vae`` memory flag) trades one more forward pass in
        the backward for a smaller autograd graph; without grad it runs the full-resolution
        head in 4-frame groups, which lowers the transient peak. Results and gradients agree
        with the plain pass up to floating-point reordering (bit for bit in float64 here).
        """
        x = self._check_video(video)
        n, t, _, h, w = x.shape
        pad = -t % TEMPORAL_FACTOR
        if pad:
            x = torch.cat([x, x[:, -1:].expand(n, pad, 3, h, w)], dim=1)
        x = x.reshape(n * (t + pad), 3, h, w)
        if checkpoint and torch.is_grad_enabled() and x.requires_grad:
            x = self._checkpointed(x, n)
        elif checkpoint:  # no graph to keep, but the head's full-resolution transients
            x = torch.cat([self._head(part) for part in x.split(TEMPORAL_FACTOR)])
            for layer in self.encoder[4:]:
                x = self._run_layer(layer, x, n)
        else:
            for layer in self.encoder:
                x = self._run_layer(layer, x, n)
        return x.reshape(n, -1, *x.shape[1:])

    def _head(self, part: torch.Tensor) -> torch.Tensor:
        """Layers 0-3 (conv, ReLU, frame-pair pool, strided conv) of one 4-frame group."""
        for layer in self.encoder[:4]:
            part = self._run_layer(layer, part, part.shape[0] // TEMPORAL_FACTOR)
        return part

    @staticmethod
    def _run_layer(layer: nn.Module, x: torch.Tensor, n: int) -> torch.Tensor:
        return layer(x, n) if isinstance(layer, (MemBlock, TPool)) else layer(x)

    def _checkpointed(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The encoder under activation checkpoints: only each block's input is kept, and the
        backward recomputes one block at a time.

        The full-resolution head (conv, ReLU, pool of frame pairs, strided conv: layers 0-3)
        holds most of the graph but never looks across a 4-frame group, so it runs in
        checkpointed 4-frame groups (each clip's T is a multiple of 4, so no group straddles
        two clips or a pair). Every later layer is its own checkpoint: the MemBlocks need the
        whole sequence (each step sees the previous one).
        """
        from torch.utils.checkpoint import checkpoint

        x = torch.cat(
            [checkpoint(self._head, part, use_reentrant=False) for part in x.split(TEMPORAL_FACTOR)]
        )
        for layer in self.encoder[4:]:
            x = checkpoint(self._run_layer, layer, x, n, use_reentrant=False)
        return x

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        """METHOD §10. (z - mu_c) / sigma_c for channel-first latents ``[N, 16, T', h, w]``."""
        shape = (1, LATENT_CHANNELS, 1, 1, 1)
        return (z - self.latents_mean.view(shape)) / self.latents_std.view(shape)

    def encode(
        self, video: torch.Tensor, *, normalize: bool = True, checkpoint: bool = False
    ) -> torch.Tensor:
        """METHOD §10. Video ``[N, T, 3, H, W]`` in [0, 1] -> Wan latents ``[N, 16, T', h, w]``.

        Channel-first like the Wan VAE's ``[B, C, F, h, w]``; normalised per channel with
        ``latents_mean`` / ``latents_std`` when ``normalize`` (raw outputs otherwise).
        ``checkpoint``: see :meth:`forward`.
        """
        z = self(video, checkpoint=checkpoint).permute(0, 2, 1, 3, 4)
        return self.normalize(z) if normalize else z


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _read_state(path: Path) -> dict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:
            raise InputError(f"{path}: not a readable safetensors file ({exc})") from exc
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(f"{path}: not a readable torch checkpoint ({exc})") from exc
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise InputError(f"{path}: expected a state dict, got {type(state).__name__}")
    return dict(state)


def load_tiny_vae(
    path: Path | str,
    *,
    device: torch.device | str = "cpu",
    latents_mean: Sequence[float] | None = None,
    latents_std: Sequence[float] | None = None,
) -> TinyVAEEncoder:
    """METHOD §10. Frozen float32 ``TinyVAEEncoder`` from ``lighttaew2_1`` weights.

    ``path``: ``.safetensors``, or a torch file (plain state dict or ``{"state_dict": ...}``)
    read with ``weights_only=True``. Only ``encoder.*`` keys are used (``decoder.*`` and others
    are ignored) and they must match exactly: missing or unexpected encoder keys and shape
    mismatches raise ValueError listing them.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"tiny VAE weights {path}: no such file")
    state = {k: v for k, v in _read_state(path).items() if k.startswith("encoder.")}
    model = TinyVAEEncoder(latents_mean=latents_mean, latents_std=latents_std)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad = sorted(
        f"{k} {tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}"
        f" (expected {tuple(expected[k].shape)})"
        for k, v in state.items()
        if k in expected
        and not (isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(expected[k].shape))
    )

    def few(items: list[str]) -> str:  # a whole foreign state dict would be hundreds of keys
        more = f" (+{len(items) - 8} more)" if len(items) > 8 else ""
        return ", ".join(items[:8]) + more

    problems = []
    if missing:
        problems.append(f"missing encoder keys: {few(missing)}")
    if unexpected:
        problems.append(f"unexpected encoder keys: {few(unexpected)}")
    if bad:
        problems.append(f"shape mismatches: {few(bad)}")
    if problems:
        raise InputError(f"tiny VAE weights {path}: " + "; ".join(problems))
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    logger.info("loaded tiny VAE encoder from %s (%d tensors)", path, len(state))
    return model.to(device)

"""Process settings a GPU training depends on (METHOD §15): the CUDA caching allocator's
configuration, which must be in the environment before CUDA starts, and returning cached
blocks between the phases of an iteration. The CLI and the Snakemake adapters call
:func:`configure_allocator` first thing; nothing below them reads the environment."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping

import torch

logger = logging.getLogger(__name__)

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


def _options(value: str) -> dict[str, str]:
    pairs = (item.split(":", 1) for item in value.split(",") if ":" in item)
    return {k.strip(): v.strip() for k, v in pairs}


def configure_allocator(env: MutableMapping[str, str]) -> str:
    """Set ``expandable_segments:True`` in ``env``'s PYTORCH_CUDA_ALLOC_CONF (what the memory
    model assumes: little fragmentation across the phases' different tensor sizes), keeping
    the user's other options; an explicit ``expandable_segments:False`` is respected. Returns
    the resulting value. Call it before CUDA initialises."""
    value = env.get(ALLOC_CONF, "").strip()
    if "expandable_segments" not in _options(value):
        value = f"{value},{EXPANDABLE}" if value else EXPANDABLE
        env[ALLOC_CONF] = value
    return value


def allocator_problem(env) -> str | None:
    """Why ``env``'s allocator setting is not the one training assumes, or None."""
    value = env.get(ALLOC_CONF, "")
    setting = _options(value).get("expandable_segments")
    if setting is None:
        return f"{ALLOC_CONF} does not set expandable_segments (chord sets it when unset)"
    if setting.lower() != "true":
        return (
            f"{ALLOC_CONF}={value}: expandable segments are off, so the caching allocator "
            "fragments across the iteration's phases (more reserved memory than the model)"
        )
    return None


def empty_cache(device) -> None:
    """Return the caching allocator's unused blocks to the GPU (a no-op off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()

"""Deterministic randomness (METHOD §18, our decision): every random value of an iteration
comes from a generator seeded by (seed + rank, iteration, purpose), so resume, coarse → fine
and the memory modes reproduce identical draws. Library code never touches global RNGs."""

from __future__ import annotations

import secrets
import zlib

import numpy as np
import torch


def base_seed(seed: int) -> int:
    """The run's base seed: ``seed`` if ≥ 0, else a fresh one (record it)."""
    return seed if seed >= 0 else secrets.randbelow(2**31)


def generator(seed: int, rank: int, iteration: int, purpose: str) -> torch.Generator:
    """A CPU generator for one (seed + rank, iteration, purpose), e.g. "cameras", "noise/2"."""
    state = np.random.SeedSequence([seed + rank, iteration, zlib.crc32(purpose.encode())])
    g = torch.Generator()
    g.manual_seed(int(state.generate_state(1, np.uint64)[0] % (2**63)))
    return g

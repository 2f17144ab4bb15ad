"""The per-phase wall time and peak GPU memory of a training iteration (``log_run_time``,
METHOD §15)."""

from __future__ import annotations

import contextlib
import time

import torch


class PhaseClock:
    """``log_run_time`` (METHOD §15): wall seconds (synchronised on CUDA) and, on CUDA, the
    peak allocated memory per phase; a no-op when disabled."""

    def __init__(self, enabled: bool):
        self.enabled, self.times = enabled, {}

    def __call__(self, name: str):
        if not self.enabled:
            return contextlib.nullcontext()
        return self._phase(name)

    @contextlib.contextmanager
    def _phase(self, name: str):
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                torch.cuda.synchronize()
                self.times[f"{name}_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
            self.times[f"{name}_s"] = time.perf_counter() - start

"""The Wan guidance's float32 fallback settings (METHOD §15): TF32 off around the DiT
passes, and what the switch costs, for its log line."""

from __future__ import annotations

import contextlib

import torch

#: Public dense peak TFLOPS of data-centre GPUs: (bf16 on tensor cores, float32 without them,
#: which is what the float32 fallback runs on with TF32 off), from NVIDIA's H100/H200 SXM and
#: A100 SXM datasheets.
DENSE_TFLOPS = {"H100/H200 SXM": (989.0, 67.0), "A100 SXM": (312.0, 19.5)}
#: The float32 fallback's TF32 decision (:func:`ieee_float32`), for its log line.
TF32_DECISION = (
    "TF32 off (matmuls and convolutions in IEEE float32, torch's 'highest'): the fallback is "
    "there because bf16 gave non-finite values, and TF32's 10-bit mantissa would bring back "
    "part of that rounding"
)


def float32_slowdown() -> str:
    """The float32 fallback's cost from :data:`DENSE_TFLOPS`, e.g. "roughly 15-16x slower DiT
    passes (...)": the DiT's matmuls leave the bf16 tensor cores for float32 arithmetic."""
    ratios = [bf16 / fp32 for bf16, fp32 in DENSE_TFLOPS.values()]
    lo, hi = round(min(ratios)), round(max(ratios))
    specs = ", ".join(f"{gpu} {b:g} vs {f:g}" for gpu, (b, f) in DENSE_TFLOPS.items())
    n = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"roughly {n}x slower DiT passes (dense bf16 vs float32 TFLOPS: {specs})"


def tf32_switches() -> tuple:
    """(object, attribute, IEEE value) of torch's TF32 switches for CUDA matmuls and cuDNN
    convolutions: the ``fp32_precision`` settings where torch has them (2.9+, where reading
    the legacy flags raises once both kinds were set), else the ``allow_tf32`` flags."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    conv = getattr(cudnn, "conv", None)
    if conv is not None and hasattr(matmul, "fp32_precision"):
        return ((matmul, "fp32_precision", "ieee"), (conv, "fp32_precision", "ieee"))
    return ((matmul, "allow_tf32", False), (cudnn, "allow_tf32", False))


@contextlib.contextmanager
def ieee_float32():
    """TF32 off inside the block (:data:`TF32_DECISION`): float32 matmuls and cuDNN
    convolutions (the DiT's patch embedding; cuDNN's default is TF32) in IEEE float32. These
    are process-wide torch settings, so each is restored on exit: nothing outside the block
    sees a change."""
    switches = tf32_switches()
    old = [getattr(obj, name) for obj, name, _ in switches]
    try:
        for obj, name, value in switches:
            setattr(obj, name, value)
        yield
    finally:
        for (obj, name, _), value in zip(switches, old, strict=True):
            setattr(obj, name, value)

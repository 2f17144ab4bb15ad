"""A stand-in for mmgp 3.8 (it needs CUDA) that does to the modules it profiles what the real
``offload.profile`` does to them (``offload._configure``), so the adapter's effect on an expert
can be checked on a CPU:

- the dtype pass: for every module of a model *without* a ``_lock_dtype`` attribute (checked
  per module, on its own parameters only: a locked module's children are not locked), its
  float32 parameters become ``convertWeightsFloatTo`` (or the model's ``_model_dtype``); the
  parameters it converts or passes must then all share one dtype (mmgp asserts it); buffers
  are never converted; every parameter is frozen;
- the argument casts: the model and each top-level submodule get float32 tensor arguments cast
  to their ``_lock_dtype``, else the model's dtype, before their forward
  (``hook_change_module`` → ``move_args_to_gpu``, without the move: there is no GPU);
- the default device is left changed (mmgp ends at CUDA; ``meta`` here, so a caller that does
  not restore it notices);
- a released offload object keeps its hooks on the module, and profiling that module again is
  an error, as the real hooks would make it.

``log`` records ``("profile", modules, kwargs)``, ``("release", module)`` and
``("unload_all", module)``.
"""

from __future__ import annotations

import types

import torch


def configure(model: torch.nn.Module, convert: torch.dtype | None = torch.bfloat16) -> None:
    """mmgp 3.8's ``_configure`` on ``model``: the dtype pass and the argument casts."""
    model_dtype = getattr(model, "_model_dtype", None)
    for name, module in model.named_modules():
        locked = hasattr(module, "_lock_dtype")
        for p_name, p in module.named_parameters(recurse=False):
            p.requires_grad = False
            if locked:
                continue
            dtype = p.dtype
            if convert is not None and dtype == torch.float32:
                dtype = convert if model_dtype is None else model_dtype
                if dtype != torch.float32:
                    p.data = p.data.to(dtype)
            if model_dtype is None:
                model_dtype = dtype
            elif model_dtype != dtype:  # mmgp: assert model_dtype == dtype
                raise AssertionError(f"{name}.{p_name}: {dtype}, the model's is {model_dtype}")
    model._dtype = model_dtype or convert or torch.bfloat16
    for name, module in model.named_modules():
        if "." not in name:  # the model ("") and its top-level submodules
            module.register_forward_pre_hook(
                _cast_hook(getattr(module, "_lock_dtype", model._dtype)), with_kwargs=True
            )


def _cast_hook(dtype: torch.dtype):
    def cast(x):
        return x.to(dtype) if torch.is_tensor(x) and x.dtype == torch.float32 else x

    def hook(module, args, kwargs):
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    return hook


class FakeMMGP:
    """The mmgp package as :class:`chord.guidance.mmgp_residency.MMGPResidency` uses it
    (``module=``): ``offload.profile``; ``has_release=False``: offload objects with
    ``unload_all`` only."""

    def __init__(self, *, has_release: bool = True):
        self.offload = self
        self.has_release = has_release
        self.log: list[tuple] = []
        self.wrapped: list[torch.nn.Module] = []

    def profile(self, modules: dict, **kwargs):
        for module in modules.values():
            if getattr(module, "_fake_mmgp_released", False):
                raise RuntimeError("module still hooked by a released mmgp offload object")
            configure(module, kwargs.get("convertWeightsFloatTo", torch.bfloat16))
            self.wrapped.append(module)
        self.log.append(("profile", dict(modules), kwargs))
        torch.set_default_device("meta")
        (module, *_) = modules.values()
        obj = types.SimpleNamespace(unload_all=lambda: self.log.append(("unload_all", module)))
        if self.has_release:

            def release():
                for m in modules.values():
                    m._fake_mmgp_released = True
                self.log.append(("release", module))

            obj.release = release
        return obj

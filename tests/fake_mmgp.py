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

from chord.checks.fake_mmgp import configure


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

"""mmgp's streaming of an expert, taken as the memory model counts it, for the faked run
(:mod:`chord.checks.fake_iteration`).

mmgp (``enable_mmgp``, METHOD §15) keeps the active expert's weights in pinned host memory and
copies them to the GPU while the DiT runs; its ``offload.profile`` needs real weights and a real
device, so it cannot run on fake tensors. :func:`fake_mmgp` hands
:class:`chord.guidance.mmgp_residency.MMGPResidency` an ``offload`` of its own instead, and the
rest of the mmgp path (the residency's activate / unload / release, the guidance's expert
switches, the float32 modules it locks) runs as on the GPU, and so does mmgp's own dtype pass
and argument casts (:func:`configure`): a float32 weight it converts meets its inputs as on the
GPU. What it does with the weights is
what :func:`chord.resources.peak_memory.estimate` counts for mmgp's window, so the trace judges
everything around that window, not the window itself:

- the expert stays on the host (wherever the loader left it: ``WanGuidance`` does not move it
  when mmgp manages it);
- during a forward the modules outside the transformer blocks are on the device;
- the blocks' modules are cut, in the order they are registered, into slices of at most
  ``budgets["transformer"]`` MiB (a module larger than that is a slice of its own); when a
  module of a slice runs, that slice and the next are on the device (mmgp's prefetch) and every
  other slice is back on the host, so at most two slices are live. Every module's forward
  checks its own slice: a block need not run its modules in the order it registers them (a Wan
  block registers its cross-attention before the norm that runs first);
- after the forward, and on ``unload_all`` / ``release``, everything is back on the host.

A weight "on the device" is a copy made on it (a new storage: the tracer counts it); "back on
the host" drops that copy (its storage is freed with it). The DiT runs without gradients, so no
graph keeps a copy alive.
"""

from __future__ import annotations

import contextlib
import types
from unittest import mock

import torch

MiB = 2**20
#: the name diffusers' WanTransformer3DModel gives its ModuleList of transformer blocks
BLOCKS = "blocks"


def _tensors(module: torch.nn.Module) -> dict:
    """The module's own parameters and buffers (not its children's), by (kind, name)."""
    own = {("p", n): t for n, t in module._parameters.items() if t is not None}
    own.update({("b", n): t for n, t in module._buffers.items() if t is not None})
    return own


def _nbytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(module).values())


class Streamed:
    """One expert under the faked offload: its outside modules and its slices of block modules,
    moved to ``device`` and back by forward hooks."""

    def __init__(self, model: torch.nn.Module, budget_bytes: int, device):
        self.device = torch.device(device)
        self.host: dict[torch.nn.Module, dict] = {}  # module -> its host tensors
        blocks = getattr(model, BLOCKS, None)
        if not isinstance(blocks, torch.nn.ModuleList):
            raise TypeError(f"{type(model).__name__}: no ModuleList {BLOCKS!r} to stream")
        in_blocks = {id(m) for m in blocks.modules()}
        self.outside = [m for m in model.modules() if id(m) not in in_blocks and _tensors(m)]
        self.slices: list[list[torch.nn.Module]] = [[]]
        size = 0
        for module in blocks.modules():  # registration order: the order a Wan block runs them
            n = _nbytes(module)
            if not n:
                continue
            if self.slices[-1] and size + n > budget_bytes:
                self.slices.append([])
                size = 0
            self.slices[-1].append(module)
            size += n
        self.slice_bytes = [sum(map(_nbytes, s)) for s in self.slices]
        self.outside_bytes = sum(map(_nbytes, self.outside))
        self.live: set[int] = set()
        self.hooks = [
            model.register_forward_pre_hook(lambda *_: self._load(self.outside)),
            model.register_forward_hook(lambda *_: self.unload_all()),
        ]
        for i, piece in enumerate(self.slices):
            hook = lambda *_, i=i: self._enter(i)  # noqa: E731
            self.hooks += [module.register_forward_pre_hook(hook) for module in piece]

    def _load(self, modules) -> None:
        for module in modules:
            if module in self.host:
                continue
            own = _tensors(module)
            self.host[module] = own
            for (kind, name), t in own.items():
                copy = t.detach().to(self.device)
                if kind == "p":
                    module._parameters[name] = torch.nn.Parameter(copy, requires_grad=False)
                else:
                    module._buffers[name] = copy

    def _drop(self, modules) -> None:
        for module in modules:
            own = self.host.pop(module, None)
            for (kind, name), t in (own or {}).items():
                (module._parameters if kind == "p" else module._buffers)[name] = t

    def _enter(self, i: int) -> None:
        """Slice ``i`` starts: it and the next are on the device, no other slice is."""
        keep = {i, i + 1} & set(range(len(self.slices)))
        if keep == self.live:
            return
        for j in self.live - keep:
            self._drop(self.slices[j])
        for j in sorted(keep - self.live):
            self._load(self.slices[j])
        self.live = keep

    def unload_all(self) -> None:
        for j in self.live:
            self._drop(self.slices[j])
        self.live = set()
        self._drop(self.outside)

    def release(self) -> None:
        self.unload_all()
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def configure(model: torch.nn.Module, convert: torch.dtype | None = torch.bfloat16) -> None:
    """mmgp 3.8's ``_configure`` on ``model`` (what its ``offload.profile`` does to the modules
    it is given): the dtype pass and the argument casts.

    - the dtype pass: for every module *without* a ``_lock_dtype`` attribute (per module, on its
      own parameters only), float32 parameters become ``convert`` (or the model's
      ``_model_dtype``); the parameters it converts or passes must then share one dtype (mmgp
      asserts it); buffers are never converted; every parameter is frozen;
    - the argument casts: the model and each top-level submodule get float32 tensor arguments
      cast to their ``_lock_dtype``, else the model's dtype, before their forward.
    """
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


def offload_module(device) -> types.SimpleNamespace:
    """A stand-in of the ``mmgp`` package for ``MMGPResidency(module=...)``: its
    ``offload.profile`` streams as the module docstring says; ``streamed`` lists what each call
    made."""
    streamed: list[Streamed] = []

    def profile(modules, *, budgets, convertWeightsFloatTo=torch.bfloat16, **_profile_kwargs):
        (model,) = modules.values()
        configure(model, convertWeightsFloatTo)
        torch.set_default_device(device)  # as mmgp leaves it; the residency restores it
        streamed.append(Streamed(model, int(budgets["transformer"]) * MiB, device))
        return streamed[-1]

    return types.SimpleNamespace(offload=types.SimpleNamespace(profile=profile), streamed=streamed)


@contextlib.contextmanager
def fake_mmgp(device):
    """Every :class:`MMGPResidency` made inside takes :func:`offload_module`'s ``offload``;
    yields that module (its ``streamed`` for the report)."""
    from chord.guidance import mmgp_residency

    module = offload_module(device)
    with mock.patch.object(mmgp_residency.MMGPResidency, "_offload", lambda self: module.offload):
        yield module

"""The mmgp adapter for ``enable_mmgp`` (METHOD §15): one Wan 2.2 expert at a time, its weights
kept in host RAM and streamed to the GPU by mmgp's ``offload.profile``.

mmgp ("Memory Management for the GPU Poor") needs CUDA, so it is imported lazily, on the first
activation, and never at import time of this file: a CPU-only run must not touch it.

mmgp's side effects, and how they are handled:

- It freezes the wrapped module (``requires_grad = False`` on every parameter) and casts float32
  weights to bf16. The experts are frozen anyway; ``activate`` freezes them first so the
  hand-over changes nothing the caller relies on.
- The cast would include what diffusers keeps in float32 on purpose in a bf16 expert
  (``WanTransformer3DModel._keep_in_fp32_modules``: the modulation tables ``scale_shift_table``,
  the ``time_embedder``, the affine ``norm2`` of each block), and its hooks cast the float32
  input of the top-level ``norm_out`` (an ``FP32LayerNorm``: float32 in, float32 out) to bf16, so
  an mmgp tier would compute another teacher than a tier without it. mmgp leaves the
  parameters, and the arguments of a top-level module, of a module that has a ``_lock_dtype``
  attribute in that dtype (checked per module, on its own parameters, in ``_configure`` and
  ``hook_change_module``): ``activate`` locks those modules in float32 first
  (:func:`lock_float32_modules`), so the expert computes what it computes without mmgp. The
  model itself is locked too (it owns a ``scale_shift_table``): mmgp leaves its float32
  arguments as they are; the guidance hands it bf16 latents and a float64 timestep anyway.
- It leaves the process-wide default device at CUDA (``torch.set_default_device('cuda')`` at
  the end of its setup). ``activate`` saves ``torch.get_default_device()`` before the call and
  restores it afterwards, so renderer and optimiser tensors keep being created where they were.

mmgp 3.8 API as used here: ``offload.profile(modules, profile_no, verboseLevel, **overrides)``
compares ``profile_no`` against the integer profiles 1..5 and forwards the overrides
(``quantizeTransformer``, ``budgets``, ``convertWeightsFloatTo``, ``asyncTransfers``, ...) to
``offload.all``. It returns the ``offload`` object, which has ``unload_all()`` (move every
block back to host RAM, keep the hooks) and ``release()`` (unload and drop everything).
Budgets are keyed by module name, so the expert is always handed over as ``"transformer"``.

mmgp imports optimum-quanto, which on a CUDA machine parses each entry of
``torch.cuda.get_arch_list()`` with ``int()`` at import (0.2.7, the newest release, and 0.2.4
and 0.2.6 alike): ``sm_90a`` (a PyTorch built for an architecture-specific target) raises
ValueError and mmgp cannot be imported (optimum-quanto issue #361, closed unfixed).
:func:`quanto_arch_list` hides the suffix for that import only.
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

PROFILES = (1.0, 2.0, 3.0, 4.0, 4.5, 5.0)  # 4.5 = profile 4 with synchronous transfers
OTHER_BUDGET_MB = 3000  # mmgp budget of every module but the transformer ("*")
MMGP_MODULE_KEY = "transformer"  # the key mmgp's budgets and profiles know the DiT by

NO_CUDA_MESSAGE = (
    "enable_mmgp needs a CUDA GPU: mmgp streams weights between host RAM and the GPU; "
    "this machine has none (run without --enable_mmgp)"
)


class MMGPResidency:
    """METHOD §15: keeps at most one Wan expert wrapped by mmgp; a switch releases the other.

    ``profile`` is ``mmgp_profile`` (1, 2, 3, 4, 4.5 or 5), ``transformer_budget_mb`` is
    ``mmgp_transformer_budget`` (MB of the expert resident on the GPU at once). ``module`` is an
    already imported mmgp package (or a stand-in with an ``offload`` attribute) for tests;
    ``cuda_check=False`` skips the CUDA check, and only together with an injected ``module``.
    The check runs at construction, so a CPU-only run fails before any work, and mmgp itself
    is imported on the first ``activate``.
    """

    def __init__(
        self,
        profile: float = 4.0,
        transformer_budget_mb: int = 100,
        *,
        module: ModuleType | Any | None = None,
        cuda_check: bool = True,
        verbose_level: int = -1,
    ) -> None:
        if isinstance(profile, bool) or float(profile) not in PROFILES:
            raise ValueError(f"profile: expected one of {PROFILES}, got {profile!r}")
        if (
            isinstance(transformer_budget_mb, bool)
            or int(transformer_budget_mb) != transformer_budget_mb
            or transformer_budget_mb <= 0
        ):
            raise ValueError(
                "transformer_budget_mb: expected a positive integer number of MB, "
                f"got {transformer_budget_mb!r}"
            )
        if not cuda_check and module is None:
            raise ValueError("cuda_check: may only be False together with an injected module")
        self.profile = float(profile)
        self.transformer_budget_mb = int(transformer_budget_mb)
        self.verbose_level = int(verbose_level)
        self._module = module
        self._cuda_check = cuda_check
        self.active_name: str | None = None  # "transformer" (high noise) or "transformer_2"
        self._offload_obj: Any = None  # what offload.profile returned for the active expert
        self.check_available()

    # --- public API ---------------------------------------------------------------------------

    def check_available(self) -> None:
        """METHOD §15: raise RuntimeError when mmgp is asked for on a machine without CUDA."""
        if self._cuda_check and not torch.cuda.is_available():
            raise RuntimeError(NO_CUDA_MESSAGE)

    def profile_kwargs(self) -> dict[str, Any]:
        """METHOD §15: the keyword arguments handed to ``offload.profile`` besides the modules.

        Profile 4.5 is not an mmgp profile (3.8 raises "Unknown profile" for it): it runs as
        profile 4 with ``asyncTransfers=False``.
        """
        kwargs: dict[str, Any] = {
            "profile_no": int(self.profile),
            "verboseLevel": self.verbose_level,
            "quantizeTransformer": False,
            "budgets": {MMGP_MODULE_KEY: self.transformer_budget_mb, "*": OTHER_BUDGET_MB},
            "convertWeightsFloatTo": torch.bfloat16,
        }
        if self.profile == 4.5:
            kwargs["asyncTransfers"] = False
        return kwargs

    def activate(self, name: str, expert: torch.nn.Module) -> None:
        """METHOD §15: make ``expert`` (registered as ``name``) the one expert mmgp manages.

        The same ``name`` again is a no-op (mmgp reloads unloaded blocks on the next forward).
        Another name first releases the active expert (``release()``, else ``unload_all()``),
        runs gc and ``empty_cache``, then wraps ``expert``, frozen, as ``{"transformer": expert}``.
        The process-wide default device is the same before and after.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: expected a non-empty expert name, got {name!r}")
        if not isinstance(expert, torch.nn.Module):
            raise ValueError(f"expert: expected a torch.nn.Module, got {type(expert).__name__}")
        if name == self.active_name:
            return
        self.check_available()
        offload = self._offload()
        if self.active_name is not None:
            self.release()
        expert.requires_grad_(False)  # mmgp freezes it anyway; make that explicit up front
        lock_float32_modules(expert)
        previous_device = torch.get_default_device()
        try:
            self._offload_obj = offload.profile({MMGP_MODULE_KEY: expert}, **self.profile_kwargs())
        finally:
            # "cpu" is torch's own default: unset it rather than install a device context
            cpu = previous_device == torch.device("cpu")
            torch.set_default_device(None if cpu else previous_device)
        self.active_name = name

    def unload(self) -> None:
        """METHOD §15: move the active expert's blocks back to host RAM after its DiT passes.

        The expert stays registered: activating the same name again does not re-wrap it.
        """
        if self._offload_obj is None:
            return
        unload_all = getattr(self._offload_obj, "unload_all", None)
        if callable(unload_all):
            unload_all()
        _free_cuda_cache()

    def release(self) -> None:
        """METHOD §15: release the active expert entirely (mmgp's ``release()``, else
        ``unload_all()``), then gc and ``empty_cache``; afterwards no expert is active."""
        obj, self._offload_obj, self.active_name = self._offload_obj, None, None
        if obj is not None:
            release = getattr(obj, "release", None)
            if callable(release):
                release()
            else:
                unload_all = getattr(obj, "unload_all", None)
                if not callable(unload_all) and self._module is not None:
                    unload_all = getattr(self._module.offload, "unload_all", None)
                if callable(unload_all):
                    unload_all()
            del obj
        gc.collect()
        _free_cuda_cache()

    # --- helpers ------------------------------------------------------------------------------

    def _offload(self) -> Any:
        """mmgp's ``offload`` module, imported on first use (after the CUDA check)."""
        if self._module is None:
            with quanto_arch_list():  # mmgp imports optimum-quanto
                import mmgp.offload  # lazy on purpose: mmgp needs CUDA

            self._module = mmgp
        return self._module.offload


def numeric_arch_list(archs: list[str]) -> list[str]:
    """``torch.cuda.get_arch_list()`` entries with their target suffix dropped (``sm_90a`` ->
    ``sm_90``, ``sm_100f`` -> ``sm_100``, ``compute_120a`` -> ``compute_120``), each once, in
    order; an entry of another form is kept as it is."""
    out = []
    for arch in archs:
        m = re.fullmatch(r"(sm|compute)_(\d+)[a-z]*", arch)
        name = f"{m[1]}_{m[2]}" if m else arch
        if name not in out:
            out.append(name)
    return out


@contextlib.contextmanager
def quanto_arch_list() -> Iterator[None]:
    """Within: ``torch.cuda.get_arch_list`` returns :func:`numeric_arch_list` of its list, so
    that optimum-quanto's import (``int(arch.split("_")[1])`` over the ``sm_`` entries, issue
    #361) gets numbers; what it computes from them, the highest architecture to build its
    kernels for, is the same. Restored on exit."""
    original = torch.cuda.get_arch_list

    def get_arch_list() -> list[str]:
        return numeric_arch_list(original())

    torch.cuda.get_arch_list = get_arch_list
    try:
        yield
    finally:
        torch.cuda.get_arch_list = original


def kept_in_float32(expert: torch.nn.Module, name: str) -> bool:
    """Whether diffusers keeps ``expert``'s parameter ``name`` in float32 when it loads the model
    in a half type: a component of the dotted name is in the class's ``_keep_in_fp32_modules``,
    matched as diffusers' ``load_model_dict_into_meta`` matches it (``"norm2"`` is
    ``blocks.0.norm2.weight``, not ``blocks.0.attn1.norm_q.weight``)."""
    keep = getattr(expert, "_keep_in_fp32_modules", None) or []
    keep = [keep] if isinstance(keep, str) else keep
    return any(k in name.split(".") for k in keep)


def float32_modules(expert: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules of ``expert`` (by qualified name, ``""`` the expert itself) that mmgp must
    leave in float32 for the expert to compute what it computes without mmgp:

    - those ``_keep_in_fp32_modules`` names (a component of the module's name) and those owning
      a parameter :func:`kept_in_float32` (the expert and its blocks own ``scale_shift_table``);
    - diffusers' ``FP32LayerNorm`` layers: they normalise in float32 and return their input's
      dtype, so mmgp's cast of a top-level one's float32 input to bf16 (Wan's ``norm_out``)
      would round an output that is float32 without mmgp.
    """
    from diffusers.models.normalization import FP32LayerNorm

    keep = getattr(expert, "_keep_in_fp32_modules", None) or []
    keep = [keep] if isinstance(keep, str) else keep
    return {
        name: module
        for name, module in expert.named_modules()
        if isinstance(module, FP32LayerNorm)
        or any(k in name.split(".") for k in keep)
        or any(
            kept_in_float32(expert, f"{name}.{p}" if name else p)
            for p, _ in module.named_parameters(recurse=False)
        )
    }


def lock_float32_modules(expert: torch.nn.Module) -> list[str]:
    """Mark the :func:`float32_modules` of ``expert`` with ``_lock_dtype = torch.float32``, so
    mmgp's ``_configure`` leaves their parameters alone and its hooks leave the float32 arguments
    of a top-level one in float32, and make the parameters :func:`kept_in_float32` float32
    (already so for an expert from ``from_pretrained``; one loaded in float32 keeps its values;
    one cast to a half type whole gets them back in float32, rounded). Returns the names."""
    owners = float32_modules(expert)
    for owner, module in owners.items():
        module._lock_dtype = torch.float32
        for p_name, p in module.named_parameters(recurse=False):
            if kept_in_float32(expert, f"{owner}.{p_name}" if owner else p_name):
                p.data = p.data.float()
    return list(owners)


def _free_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

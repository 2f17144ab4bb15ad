"""A faked ``cuda:0`` on which the training's own code runs without a GPU (no data, no kernels):
what a CUDA run would refuse, this refuses too.

Inside :func:`fake_cuda`:

- every tensor made or moved inside is a fake tensor (``FakeTensorMode``): shape, dtype and
  device, no storage; each op runs its meta function. A CPU build of torch needs
  :mod:`chord.checks.cuda_shim` loaded before torch for autograd to accept a CUDA device.
  What the fake mode already refuses as CUDA does: operands on two devices (a tensor made on
  the CPU inside the step meeting one on ``cuda:0``; a 0-dim CPU tensor is allowed, as CUDA
  allows it).
- :class:`DeviceRules` holds what CUDA's kernels check and the meta functions do not: the
  operands of a matrix product, a convolution or attention share one dtype (a bf16 activation
  against a float32 weight; CUDA says "expected mat1 and mat2 to have the same dtype"). It also
  answers what a fake tensor cannot, and counts it: a value read back to the host (``.item()``,
  ``float(t)``, ``int(t)``: a synchronisation on a GPU) that the fake mode does not know is
  what a healthy run reads (0: no NaN, no non-finite entry, a zero reported loss; an ``all``
  holds, an ``any`` does not), so code steered by such a value takes its healthy path; a shape
  that depends on data (``nonzero``, boolean masks) takes its largest value (every element
  selected: the memory's worst case). Small tensors whose values are known on the host (frame
  numbers, an optimiser's step) keep them, so what depends on those is exact.
- ``torch.cuda``'s functions that a CPU build lacks answer for the fake device:
  ``is_available`` (so autocast to bf16 runs as on a GPU), the device's properties with
  ``total_memory`` the budget given, and its memory counters (0: peaks are traced elsewhere).

Not faked, so modelled where it matters (:mod:`chord.checks.fake_iteration` says which): mmgp's
host-side streaming of the experts (it moves real weights between host and device), and the
choice of an attention kernel (:func:`fused_attention`: a real device picks a fused kernel; a
CPU build on a fake device would take the math path and materialise the score matrix).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import weakref
from collections import Counter
from types import SimpleNamespace
from unittest import mock

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map_only
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten

DEVICE = torch.device("cuda", 0)
#: ops whose CUDA kernels require one dtype across their tensor operands (the output's dtype
#: argument apart): matrix products, convolutions and attention
SAME_DTYPE = {
    aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.addbmm, aten.addmv, aten.mv, aten.dot,
    aten.convolution, aten._convolution, aten.cudnn_convolution,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention, aten.scaled_dot_product_attention,
}  # fmt: skip
#: tensors of at most this many elements carry their host values
VALUE_NUMEL = 4096
#: factory ops whose small outputs have known values
FACTORIES = {aten.arange, aten.full, aten.zeros, aten.ones, aten.scalar_tensor, aten.linspace}
#: ops whose output holds no values until written
UNINITIALISED = {aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty,
                 aten.new_empty_strided}  # fmt: skip


class DeviceRuleError(RuntimeError):
    """What a CUDA kernel would refuse."""


@dataclasses.dataclass
class Readbacks:
    """Values read back to the host (GPU synchronisations) and data-dependent shapes, by op."""

    host: Counter = dataclasses.field(default_factory=Counter)
    shapes: Counter = dataclasses.field(default_factory=Counter)
    attention: Counter = dataclasses.field(default_factory=Counter)  # the fused kernels taken


#: the CUDA caching allocator's block size: every allocation is rounded up to it
BLOCK = 512


class DeviceMemory:
    """Live bytes on the faked device, traced at dispatch: each storage an op's output holds is
    counted once (rounded to :data:`BLOCK`) until the storage dies (a weak reference to it,
    which torch keeps for as long as C++ holds it: autograd's saved tensors included). What a
    trace does not see: the allocator's fragmentation and cached free blocks (``reserved``),
    kernels' workspaces (cuBLAS, cuDNN, attention), CUDA's context."""

    def __init__(self):
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def allocated(self, t) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._sizes:
            return
        size = -(-storage.nbytes() // BLOCK) * BLOCK
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def reset_peak(self) -> int:
        """Start a new peak at the live bytes; returns the old peak."""
        old, self.peak = self.peak, self.live
        return old


class DeviceRules(TorchDispatchMode):
    """Entered above a FakeTensorMode: CUDA's dtype rules, and answers for host reads and
    data-dependent shapes (see the module's docstring).

    Small tensors (at most :data:`VALUE_NUMEL` elements: frame numbers, masks of them, index
    lists, an optimiser's step count) carry their values beside the fake, computed on the host
    from values known where they were made (``arange``, ``full``, a tensor of Python numbers, a
    real tensor moved in) and never from a random draw: a shape or a read that depends on them
    is exact. Anything else that depends on data takes the answer above."""

    def __init__(self, fake: FakeTensorMode):
        super().__init__()
        self.fake = fake
        self.readbacks = Readbacks()
        self.alls = WeakIdKeyDictionary()  # outputs of aten.all (by identity, not ==)
        self.values = WeakIdKeyDictionary()  # fake -> its values on the host (small ints)
        self.memory = DeviceMemory()
        self.flops = Counter()  # FLOPs by the innermost named phase (torch's formulas)
        self.phase: list[str] = []  # the phases being run, innermost last

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # a real tensor reaching an op (a module's CPU weights moved to the device, a constant)
        # is made fake first: the fake mode below takes only fake inputs from a mode above it
        args, kwargs = tree_map_only(torch.Tensor, self._fake, (args, kwargs or {}))
        packet = func.overloadpacket
        if packet in SAME_DTYPE:
            self._same_dtype(func, args, kwargs)
        real = self._on_host(func, args, kwargs)
        if func is aten._local_scalar_dense.default:
            return self._read(func, args, real)
        try:
            out = func(*args, **kwargs)
        except DynamicOutputShapeException:
            self.readbacks.shapes[str(packet)] += 1
            if real is not None:
                out = tree_map_only(torch.Tensor, lambda r: self._fake(r).to(args[0].device), real)
            else:
                out = _largest(func, args, kwargs)
        if real is not None:
            pairs = zip(tree_leaves(out), tree_leaves(real), strict=False)
            for o, r in pairs:
                if isinstance(o, torch.Tensor) and _small(r):
                    self.values[o] = r
        else:
            self._forget_written(func, args, kwargs)
        if packet is aten.all and isinstance(out, torch.Tensor):
            self.alls[out] = True
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                self.memory.allocated(t)
        formula = flop_registry.get(packet)
        if formula is not None:
            self.flops[self.phase[-1] if self.phase else "other"] += formula(
                *args, **kwargs, out_val=out
            )
        return out

    def _read(self, func, args, real):
        """A value read back to the host: the known value, what the fake mode knows (a tensor
        made from Python numbers), or a healthy run's answer."""
        self.readbacks.host[_caller()] += 1
        if real is not None:
            return real
        try:
            return func(*args)
        except DataDependentOutputException:
            pass
        (t,) = args
        if t.dtype == torch.bool:  # all(...) holds, any(...) does not: nothing is wrong
            return self.alls.get(t, False)
        return 0 if not (t.is_floating_point() or t.is_complex()) else 0.0

    def _on_host(self, func, args, kwargs):
        """``func`` on the host values of its inputs, when every tensor input has them (or it
        is a factory op of known values) and the op is neither random nor uninitialised; None
        otherwise."""
        if torch.Tag.nondeterministic_seeded in func.tags or func.overloadpacket in UNINITIALISED:
            return None
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if any(self._value(t) is None for t in tensors):
            return None
        if not tensors and not _factory(func):
            return None
        real_args, real_kwargs = tree_map_only(torch.Tensor, self._value, (args, kwargs))
        if "device" in real_kwargs:
            real_kwargs = {**real_kwargs, "device": torch.device("cpu")}
        with _disable_current_modes():
            return func(*real_args, **real_kwargs)

    def _value(self, t):
        """A fake tensor's host values: ours, or the fake mode's own constant (a tensor made
        from Python numbers, e.g. ``torch.tensor(0.0)``)."""
        value = self.values.get(t)
        if value is None and isinstance(t, FakeTensor) and t.constant is not None:
            with _disable_current_modes():
                value = self.values[t] = t.constant.clone()
        return value

    def _forget_written(self, func, args, kwargs):
        """An op that wrote into a tensor with host values, without computing them: they are
        no longer known."""
        for arg, value in zip(func._schema.arguments, args, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write:
                self.values.pop(value, None)

    def _fake(self, t):
        if isinstance(t, FakeTensor):
            return t
        fake = self.fake.from_tensor(t)
        # index lists and scalars moved in carry their values; a module's weights do not (a
        # weak reference to a parameter stops torch swapping it when the module moves again)
        if _small(t) and (t.dim() == 0 or not (t.is_floating_point() or t.is_complex())):
            with _disable_current_modes():
                self.values[fake] = t.detach().clone()
        return fake

    @staticmethod
    def _same_dtype(func, args, kwargs):
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        on_cuda = [t for t in tensors if t.device.type == "cuda"]
        dtypes = {t.dtype for t in on_cuda}
        if len(dtypes) > 1:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
            raise DeviceRuleError(
                f"{func}: operands of {names} on {DEVICE}: CUDA's kernel expects one dtype "
                f"(a matrix product, convolution or attention of mixed precision; autocast "
                f"or a cast of the operand makes them agree)"
            )


def _small(t) -> bool:
    real = isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)
    return real and t.numel() <= VALUE_NUMEL


def _factory(func) -> bool:
    """A factory op (no tensor input) whose values are known: arange, full, zeros, ..."""
    return func.overloadpacket in FACTORIES


def _largest(func, args, kwargs):
    """The output of a data-shaped op when every element is selected: a boolean mask in an
    index stands for every position it covers."""
    x = args[0]
    packet = func.overloadpacket
    if packet is aten.index:
        indices = []
        for idx in args[1]:
            if idx is not None and idx.dtype == torch.bool:
                flat = torch.arange(idx.numel(), device=idx.device)
                for size, stride in zip(idx.shape, _strides(idx.shape), strict=True):
                    indices.append(flat // stride % size)
            else:
                indices.append(idx)
        return func(x, indices)
    if packet is aten.nonzero:
        return x.new_empty((x.numel(), x.dim()), dtype=torch.long)
    if packet is aten.masked_select:
        mask = args[1]
        return x.new_empty((torch.broadcast_shapes(x.shape, mask.shape).numel(),))
    # unique: every element distinct (values, inverse, counts as the op returns them)
    n = x.numel()
    return (x.new_empty((n,)), x.new_empty(x.shape, dtype=torch.long),
            x.new_empty((n,), dtype=torch.long))  # fmt: skip


def _strides(shape) -> list[int]:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= size
    return out[::-1]


def _caller() -> str:
    """The first frame outside torch and this module: who read a value back."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("torch", __name__)):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _properties(budget_bytes: int):
    return SimpleNamespace(
        name="faked CUDA device (chord.checks.fake_cuda)",
        total_memory=int(budget_bytes),
        major=9,
        minor=0,
        multi_processor_count=132,
        is_integrated=False,
    )


def _swap_or_set(swap_tensors):
    """``torch.utils.swap_tensors`` for a module moved again (``.to(dtype)``, a second
    ``.to(device)``): fake tensors carry weak references of the fake mode's own, which swapping
    refuses, so their contents are set instead (``.data``, and the fake device), as
    ``Module._apply`` does for plain tensors."""

    def swap(t1, t2):
        try:
            return swap_tensors(t1, t2)
        except RuntimeError as exc:
            if "weakref" not in str(exc) or not isinstance(t1, FakeTensor):
                raise
        with torch.no_grad():
            t1.data = t2.data
        t1.fake_device = t2.fake_device

    return swap


def fused_attention(sdpa, counts: Counter):
    """``scaled_dot_product_attention`` as CUDA runs it: a fused kernel, never the math path
    that materialises the [L, S] score matrix (the CPU build's choice on a fake device). Which
    fused kernel a real device picks depends on the card; the model takes flash attention for
    bf16/fp16 without a mask and head dim ≤ 256 (its output and log-sum-exp: O(L) memory, as
    cuDNN's attention on Hopper), the memory-efficient kernel otherwise (float32, masks)."""

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                  scale=None, enable_gqa=False):  # fmt: skip
        if query.device.type != "cuda" or enable_gqa:
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                        enable_gqa=enable_gqa)  # fmt: skip
        if torch.is_autocast_enabled("cuda"):  # autocast casts the composite op's operands
            dtype = torch.get_autocast_dtype("cuda")
            query, key, value = (t.to(dtype) for t in (query, key, value))
        half = query.dtype in (torch.float16, torch.bfloat16)
        if attn_mask is None and half and query.shape[-1] <= 256:
            counts["flash"] += 1
            return aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )[0]
        counts["efficient"] += 1
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, grad, dropout_p, is_causal, scale=scale
        )[0]

    return attention


@contextlib.contextmanager
def cuda_facade(budget_bytes: int):
    """``torch.cuda``'s Python functions answered for one faked device of ``budget_bytes``."""
    props = _properties(budget_bytes)
    patches = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "get_device_properties": lambda device=None: props,
        "get_device_name": lambda device=None: props.name,
        "get_device_capability": lambda device=None: (props.major, props.minor),
        "get_arch_list": lambda: ["sm_90"],
        "is_bf16_supported": lambda *a, **k: True,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "mem_get_info": lambda device=None: (props.total_memory, props.total_memory),
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "memory_reserved": lambda device=None: 0,
        "max_memory_reserved": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None,
    }
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(torch.cuda, name, value))
        swap = _swap_or_set(torch.utils.swap_tensors)
        stack.enter_context(mock.patch.object(torch.utils, "swap_tensors", swap))
        yield props


@contextlib.contextmanager
def attention_kernels(counts: Counter):
    """:func:`fused_attention` in place of ``torch.nn.functional``'s, for the faked run."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention",
                           fused_attention(sdpa, counts)):  # fmt: skip
        yield


@contextlib.contextmanager
def fake_cuda(budget_bytes: int = 80 * 10**9):
    """The faked device: fake tensors, CUDA's rules and ``torch.cuda``'s answers; yields the
    :class:`DeviceRules` (its ``readbacks`` count host reads and data-shaped ops)."""
    if not torch.cuda.is_available() and not _shim_loaded():
        raise RuntimeError(
            "the fake CUDA device needs chord.checks.cuda_shim loaded before torch (a CPU build "
            "of torch has no CUDA device guard): run python -m chord.checks.fake_iteration"
        )
    fake = _FakeMode(allow_non_fake_inputs=True)
    rules = DeviceRules(fake)
    with cuda_facade(budget_bytes), attention_kernels(rules.readbacks.attention), fake, rules:
        yield rules


class _FakeMode(FakeTensorMode):
    """The fake mode as on a machine without CUDA, whatever the facade's ``is_available`` says:
    a tensor made from data for the device (``torch.tensor(..., device="cuda")``) is made on
    the CPU and then moved, never allocated by a CUDA kernel."""

    avoid_device_init = True


def _shim_loaded() -> bool:
    """Whether autograd accepts a CUDA tensor here (the shim's hooks are in place)."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "cuda"

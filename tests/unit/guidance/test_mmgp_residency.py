"""The mmgp adapter (METHOD §15), exercised with a fake mmgp module on the CPU."""

import sys
import types

import pytest
import torch

from chord.guidance import mmgp_residency, tiny_models, wan
from chord.guidance.mmgp_residency import NO_CUDA_MESSAGE, MMGPResidency
from chord.guidance.wan_folder import load_expert
from tests import components
from tests.components import skip_without
from tests.fake_mmgp import FakeMMGP


def expert(tag):
    module = torch.nn.Linear(2, 2)
    module.tag = tag
    return module


def tags(log):
    """The log of a :class:`FakeMMGP` as (what, tag of the expert)."""
    return [
        (what, (*arg.values(),)[0].tag if what == "profile" else arg.tag) for what, arg, *_ in log
    ]


@pytest.fixture(autouse=True)
def _restore_default_device():
    yield
    torch.set_default_device(None)


def residency(profile=4.0, *, has_release=True):
    fake = FakeMMGP(has_release=has_release)
    return MMGPResidency(profile, 100, module=fake, cuda_check=False), fake.log


@pytest.mark.parametrize("profile", [4.0, 4.5, 2, 5])
def test_profile_call(profile):
    res, log = residency(profile)
    high = expert("high")
    res.activate("transformer", high)
    [(what, modules, kwargs)] = log
    assert what == "profile" and tags(log) == [("profile", "high")]
    assert list(modules) == ["transformer"] and modules["transformer"] is high
    assert kwargs["profile_no"] == int(profile) and isinstance(kwargs["profile_no"], int)
    assert kwargs["quantizeTransformer"] is False
    assert kwargs["budgets"] == {"transformer": 100, "*": 3000}
    assert kwargs["convertWeightsFloatTo"] is torch.bfloat16
    if profile == 4.5:
        assert kwargs["asyncTransfers"] is False
    else:
        assert "asyncTransfers" not in kwargs
    assert not any(p.requires_grad for p in high.parameters())
    assert res.active_name == "transformer"


def test_default_device_restored():
    res, _ = residency()
    assert torch.get_default_device() == torch.device("cpu")
    res.activate("transformer", expert("high"))
    assert torch.get_default_device() == torch.device("cpu")
    assert torch.empty(1).device == torch.device("cpu")


def test_switch_releases_previous_first_and_same_name_is_noop():
    res, log = residency()
    high, low = expert("high"), expert("low")
    res.activate("transformer", high)
    res.activate("transformer", high)
    assert tags(log) == [("profile", "high")]
    res.activate("transformer_2", low)
    assert tags(log) == [("profile", "high"), ("release", "high"), ("profile", "low")]
    assert log[2][1]["transformer"] is low
    assert res.active_name == "transformer_2"


def test_switch_falls_back_to_unload_all_without_release():
    res, log = residency(has_release=False)
    res.activate("transformer", expert("high"))
    res.activate("transformer_2", expert("low"))
    assert tags(log) == [("profile", "high"), ("unload_all", "high"), ("profile", "low")]


def test_unload_keeps_expert_registered_and_release_clears():
    res, log = residency()
    res.unload()  # nothing active: nothing to do
    res.activate("transformer", expert("high"))
    res.unload()
    assert tags(log)[-1] == ("unload_all", "high")
    assert res.active_name == "transformer"
    res.activate("transformer", expert("high"))  # still registered: no new profile call
    assert sum(entry[0] == "profile" for entry in log) == 1
    res.release()
    assert tags(log)[-1] == ("release", "high") and res.active_name is None
    res.release()  # idempotent
    assert tags(log)[-1] == ("release", "high") and len(log) == 3


def test_bad_arguments():
    module = FakeMMGP()
    with pytest.raises(ValueError, match="profile"):
        MMGPResidency(3.5, module=module, cuda_check=False)
    with pytest.raises(ValueError, match="transformer_budget_mb"):
        MMGPResidency(4.0, 0, module=module, cuda_check=False)
    with pytest.raises(ValueError, match="cuda_check"):
        MMGPResidency(cuda_check=False)
    res = MMGPResidency(module=module, cuda_check=False)
    with pytest.raises(ValueError, match="name"):
        res.activate("", expert("high"))
    with pytest.raises(ValueError, match="expert"):
        res.activate("transformer", object())


@skip_without(components.CPU_ONLY, not torch.cuda.is_available(), "checks the CPU-only error")
def test_real_path_without_cuda_raises_and_does_not_import_mmgp(monkeypatch):
    for name in [m for m in sys.modules if m == "mmgp" or m.startswith("mmgp.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(RuntimeError) as info:
        MMGPResidency()
    assert str(info.value) == NO_CUDA_MESSAGE
    assert "--enable_mmgp" in str(info.value)
    module = FakeMMGP()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        MMGPResidency(module=module)  # an injected module still needs cuda_check=False
    assert "mmgp" not in sys.modules


def test_real_path_imports_mmgp_lazily(monkeypatch):
    """With CUDA reported, the first activation imports ``mmgp.offload`` (a fake one here)."""
    fake = FakeMMGP()
    log = fake.log
    package = types.ModuleType("mmgp")
    offload = types.ModuleType("mmgp.offload")
    offload.profile = fake.profile
    package.offload = offload
    monkeypatch.setitem(sys.modules, "mmgp", package)
    monkeypatch.setitem(sys.modules, "mmgp.offload", offload)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    res = MMGPResidency()
    assert log == []
    res.activate("transformer", expert("high"))
    res.activate("transformer_2", expert("low"))
    assert tags(log) == [("profile", "high"), ("release", "high"), ("profile", "low")]
    assert torch.get_default_device() == torch.device("cpu")


def test_module_does_not_import_mmgp_at_import_time():
    assert "mmgp" not in vars(mmgp_residency)


# --- optimum-quanto's parse of torch.cuda.get_arch_list() (its issue #361) --------------------


def test_numeric_arch_list_drops_the_target_suffixes():
    archs = ["sm_80", "sm_90", "sm_90a", "sm_100f", "compute_120a", "gfx90a"]
    assert mmgp_residency.numeric_arch_list(archs) == [
        "sm_80",
        "sm_90",
        "sm_100",
        "compute_120",
        "gfx90a",
    ]


# --- what diffusers keeps in float32 stays float32 under mmgp ---------------------------------


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    return tiny_models.write_tiny_wan(tmp_path_factory.mktemp("wan") / "w")


def dtypes(model):
    return {name: p.dtype for name, p in model.named_parameters()}


def test_wrapping_keeps_the_dtypes_from_pretrained_gives_a_bf16_expert(wan_folder):
    """mmgp casts every float32 parameter of an unlocked module to bf16; an expert it wraps keeps
    the dtypes diffusers loads a bf16 Wan expert in: its ``_keep_in_fp32_modules``
    (``scale_shift_table``, ``time_embedder``, the blocks' affine ``norm2``) in float32, the rest
    in bf16. So does an expert loaded in float32 (the CPU guidance's), after wrapping."""
    loaded = load_expert(wan_folder, "transformer", dtype=torch.bfloat16)
    reference = dtypes(loaded)
    kept = {n for n, d in reference.items() if d == torch.float32}
    assert {
        "scale_shift_table",
        "blocks.0.scale_shift_table",
        "blocks.0.norm2.weight",
        "condition_embedder.time_embedder.linear_1.weight",
    } <= kept
    for dtype in (torch.bfloat16, torch.float32):
        res, _ = residency()
        model = load_expert(wan_folder, "transformer", dtype=dtype)
        res.activate("transformer", model)
        assert dtypes(model) == reference, dtype
        assert model.norm_out._lock_dtype == torch.float32  # its float32 input stays float32


def test_the_teacher_under_mmgp_is_the_teacher_without(wan_folder):
    """The bf16 teacher (autocast on the CPU here) computes the same velocity with the expert
    wrapped by mmgp as without: the same weights in the same dtypes, the same operations, so the
    same bits (a tolerance of 0: nothing is reordered). Without the float32 locks the modulation
    tables, time embedding and norms would be rounded to bf16, and the final norm's output too:
    a difference of ~1.6% (relative, L2) on the tiny expert."""
    g = torch.Generator().manual_seed(0)
    video = torch.rand(41, 3, 16, 32, generator=g)
    z = torch.randn(1, 16, 11, 2, 4, generator=g)
    text = {
        k: torch.randn(512, tiny_models.TINY_TEXT_DIM, generator=g) for k in ("prompt", "negative")
    }
    velocities = []
    for mmgp in (None, residency()[0]):
        teacher = wan.WanGuidance(wan_folder, dtype=torch.bfloat16, mmgp=mmgp)
        y = teacher.condition(video)
        velocities.append([teacher.velocity(z, t, [y], text, cfg_scale=3.5) for t in (0.95, 0.5)])
    for full, offload in zip(*velocities, strict=True):
        torch.testing.assert_close(offload, full, rtol=0, atol=0)

"""The mmgp adapter (METHOD §15), exercised with a fake mmgp module on the CPU."""

import sys
import types

import pytest
import torch

from chord.guidance import mmgp_residency
from chord.guidance.mmgp_residency import NO_CUDA_MESSAGE, MMGPResidency


class FakeOffloadObj:
    def __init__(self, log, name, *, has_release=True):
        self.log, self.name = log, name
        if has_release:
            self.release = lambda: log.append(("release", self.name))

    def unload_all(self):
        self.log.append(("unload_all", self.name))


def fake_mmgp(*, has_release=True):
    """A stand-in for the mmgp package: ``offload.profile`` records its call and, like mmgp,
    leaves the default device changed."""
    log = []

    def profile(modules, **kwargs):
        (expert,) = modules.values()
        log.append(("profile", dict(modules), kwargs, expert.tag))
        torch.set_default_device("meta")
        return FakeOffloadObj(log, expert.tag, has_release=has_release)

    return types.SimpleNamespace(offload=types.SimpleNamespace(profile=profile)), log


def expert(tag):
    module = torch.nn.Linear(2, 2)
    module.tag = tag
    return module


@pytest.fixture(autouse=True)
def _restore_default_device():
    yield
    torch.set_default_device(None)


def residency(profile=4.0, *, has_release=True):
    module, log = fake_mmgp(has_release=has_release)
    return MMGPResidency(profile, 100, module=module, cuda_check=False), log


@pytest.mark.parametrize("profile", [4.0, 4.5, 2, 5])
def test_profile_call(profile):
    res, log = residency(profile)
    high = expert("high")
    res.activate("transformer", high)
    [(what, modules, kwargs, tag)] = log
    assert what == "profile" and tag == "high"
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
    assert [entry[0] for entry in log] == ["profile"]
    res.activate("transformer_2", low)
    assert [entry[0] for entry in log] == ["profile", "release", "profile"]
    assert log[1] == ("release", "high") and log[2][1]["transformer"] is low
    assert res.active_name == "transformer_2"


def test_switch_falls_back_to_unload_all_without_release():
    res, log = residency(has_release=False)
    res.activate("transformer", expert("high"))
    res.activate("transformer_2", expert("low"))
    assert [entry[0] for entry in log] == ["profile", "unload_all", "profile"]
    assert log[1] == ("unload_all", "high") and log[2][3] == "low"


def test_unload_keeps_expert_registered_and_release_clears():
    res, log = residency()
    res.unload()  # nothing active: nothing to do
    res.activate("transformer", expert("high"))
    res.unload()
    assert log[-1] == ("unload_all", "high")
    assert res.active_name == "transformer"
    res.activate("transformer", expert("high"))  # still registered: no new profile call
    assert sum(entry[0] == "profile" for entry in log) == 1
    res.release()
    assert log[-1] == ("release", "high") and res.active_name is None
    res.release()  # idempotent
    assert log[-1] == ("release", "high")


def test_bad_arguments():
    module, _ = fake_mmgp()
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_real_path_without_cuda_raises_and_does_not_import_mmgp(monkeypatch):
    for name in [m for m in sys.modules if m == "mmgp" or m.startswith("mmgp.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(RuntimeError) as info:
        MMGPResidency()
    assert str(info.value) == NO_CUDA_MESSAGE
    assert "--enable_mmgp" in str(info.value)
    module, _ = fake_mmgp()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        MMGPResidency(module=module)  # an injected module still needs cuda_check=False
    assert "mmgp" not in sys.modules


def test_real_path_imports_mmgp_lazily(monkeypatch):
    """With CUDA reported, the first activation imports ``mmgp.offload`` (a fake one here)."""
    module, log = fake_mmgp()
    package = types.ModuleType("mmgp")
    offload = types.ModuleType("mmgp.offload")
    offload.profile = module.offload.profile
    package.offload = offload
    monkeypatch.setitem(sys.modules, "mmgp", package)
    monkeypatch.setitem(sys.modules, "mmgp.offload", offload)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    res = MMGPResidency()
    assert log == []
    res.activate("transformer", expert("high"))
    res.activate("transformer_2", expert("low"))
    assert [entry[0] for entry in log] == ["profile", "release", "profile"]
    assert torch.get_default_device() == torch.device("cpu")


def test_module_does_not_import_mmgp_at_import_time():
    assert "mmgp" not in vars(mmgp_residency)

"""mmgp imported in a fresh process on a torch that says it is a CUDA build whose arch list has
sm_90a: bare it fails, through chord's arch-list shim it imports (the residency itself:
tests/unit/guidance/test_mmgp_residency.py)."""

from __future__ import annotations

import subprocess
import sys

#: a CUDA build of torch, as far as optimum-quanto's import asks, whose arch list has sm_90a:
#: mmgp imported bare, then (in the same process: the failed import leaves the module that
#: raised to be imported again) through MMGPResidency
FAKE_CUDA = """
import sys, torch
torch.cuda.is_available = lambda: True
torch.version.cuda = "13.0"
archs = lambda: ["sm_80", "sm_90", "sm_90a"]
torch.cuda.get_arch_list = archs
try:
    import mmgp.offload
    print("bare: imported")
except ValueError as exc:
    print("bare:", exc)
from chord.guidance.mmgp_residency import MMGPResidency
offload = MMGPResidency()._offload()
from optimum.quanto.library.extensions import cuda
assert torch.cuda.get_arch_list is archs  # restored
print(offload.__name__, cuda.quanto_cuda_arch)
"""


def test_mmgp_imports_on_a_torch_with_sm_90a_through_the_arch_list_shim():
    """optimum-quanto (mmgp's) int()s each sm_ entry at import on CUDA: bare, sm_90a fails the
    import (if this starts passing, a fixed release is installed and the shim can go); through
    MMGPResidency it imports."""
    proc = subprocess.run([sys.executable, "-c", FAKE_CUDA], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    bare, shim = proc.stdout.splitlines()
    assert bare == "bare: invalid literal for int() with base 10: '90a'"
    assert shim.split() == ["mmgp.offload", "000"]  # no GPU visible: no architecture

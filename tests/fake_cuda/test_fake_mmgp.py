"""mmgp's streaming as the faked run takes it (chord.checks.fake_mmgp): the expert stays on the
host, a forward has at most two budget slices of its blocks and the modules outside them on the
device, and the device holds none of it afterwards: the window the memory model counts
(chord.resources.peak_memory.estimate: 2 * max(budget, largest tensor) + outside)."""

from __future__ import annotations

import json

from tests.fake_cuda.test_fake_iteration import python

PROBE = r"""
import json
from chord.checks import cuda_shim
cuda_shim.load()
import torch
from chord.checks import fake_cuda, fake_mmgp
from chord.guidance.mmgp_residency import MMGPResidency

MiB = 2**20
WIDTH = 1024  # a 1024x1024 Linear, which mmgp converts to bf16: 2 MiB of weight, 2 KiB of bias

class Block(torch.nn.Module):  # runs its modules in another order than it registers them
    def __init__(self):
        super().__init__()
        self.first, self.second, self.third = (torch.nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x):  # as a Wan block runs its norm2 before its attn2
        return self.second(self.third(self.first(x)))

class Expert(torch.nn.Module):  # the shape mmgp streams: an embedding, blocks, a head
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(WIDTH, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(6))
        self.head = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
            seen.append(rules.memory.live)
        return self.head(x)

out, seen = {}, []
with fake_cuda.fake_cuda() as rules, fake_mmgp.fake_mmgp(fake_cuda.DEVICE) as module:
    expert = Expert()  # built on the host, as the loader leaves an expert mmgp manages
    residency = MMGPResidency(4.0, 5)  # 5 MiB: slices of two Linears (the budget holds 2, not 3)
    residency.activate("transformer", expert)
    x = torch.randn(2, WIDTH, device="cuda")
    base = rules.memory.live
    rules.memory.reset_peak()
    with torch.no_grad():
        y = expert(x)
    out["device"], out["dtype"] = str(y.device), str(y.dtype)
    out["weights_on"] = sorted({str(p.device) for p in expert.parameters()})
    out["peak"] = rules.memory.peak - base
    out["in_forward"] = [b - base for b in seen]
    out["after"] = rules.memory.live - base
    s = module.streamed[0]
    out["slices"] = [len(piece) for piece in s.slices]
    out["slice_bytes"], out["outside_bytes"] = s.slice_bytes, s.outside_bytes
    residency.release()
    out["hooks_left"] = len(s.hooks)
print(json.dumps(out))
"""


def test_a_forward_holds_two_slices_and_the_outside_then_nothing():
    proc = python("-c", PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    linear = 1024 * 1024 * 2 + 1024 * 2  # bytes of one bf16 Linear's weight and bias
    # the 5 MiB budget takes two Linears a slice: a slice ends inside every other block
    assert out["slices"] == [2] * 9 and out["slice_bytes"] == [2 * linear] * 9
    assert out["outside_bytes"] == 2 * linear  # the embedding and the head
    # the expert computes on the device, and its weights stay on the host
    assert out["device"] == "cuda:0" and out["weights_on"] == ["cpu"]
    # mmgp's dtype pass and argument casts: bf16 weights meet bf16 inputs
    assert out["dtype"] == "torch.bfloat16"
    activation = 2 * 1024 * 4  # a [2, 1024] activation, float32 at most
    window = 2 * max(out["slice_bytes"]) + out["outside_bytes"]
    # during the forward: the outside and at most two slices (and a few activations) ...
    assert all(b <= window + 4 * activation + 4 * 512 for b in out["in_forward"])
    # ... and at least a slice and the outside: the weights do come to the device
    assert min(out["in_forward"]) >= out["outside_bytes"] + max(out["slice_bytes"])
    assert window <= out["peak"] <= window + 4 * activation + 4 * 512
    # afterwards the device holds the output alone
    assert out["after"] <= 2 * activation
    assert out["hooks_left"] == 0

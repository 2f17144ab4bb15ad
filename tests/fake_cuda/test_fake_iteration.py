"""The GPU path on a faked ``cuda:0`` (chord.checks.fake_cuda, chord.checks.fake_iteration): the
trainer's own iteration runs for every tier's memory flags, and the device refuses what CUDA
refuses. Each runs in a fresh interpreter: the fake device must be loaded before torch."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from chord.checks import cuda_shim
from chord.config import settings
from chord.core import procrustes
from chord.resources import tiers
from tests import components
from tests.conftest import REPO

CONFIG = REPO / "config" / "config.yaml"
#: the model may exceed the traced peak by at most this factor (docs/BENCHMARKS.md, "At A14B's
#: shapes": 1.01-1.21 there)
MODEL_MARGIN = 1.25

PROBE = r"""
import json
from chord.checks import cuda_shim
cuda_shim.load()
import torch
from chord.checks import fake_cuda

def refused(fn):
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

out = {}
with fake_cuda.fake_cuda() as rules:
    x = torch.randn(4, 4, device="cuda", requires_grad=True)
    out["cpu_operand"] = refused(lambda: x @ torch.ones(4, 4))
    out["cpu_scalar"] = refused(lambda: x * torch.tensor(2.0))
    out["bf16_matmul"] = refused(lambda: x.bfloat16() @ x)
    image = torch.randn(1, 3, 8, 8, device="cuda", dtype=torch.bfloat16)
    out["bf16_conv"] = refused(
        lambda: torch.nn.functional.conv2d(image, torch.randn(4, 3, 3, 3, device="cuda"))
    )
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out["autocast_dtype"] = str((x @ x).dtype)
    (x * 2).sum().backward()
    out["grad"] = [str(x.grad.device), type(x.grad).__name__]
    frames = torch.arange(9, device="cuda")
    out["moving"] = list(frames[frames != 0].shape)
    out["nan_count"] = int(torch.isnan(x).sum())
    out["all_finite"] = bool(torch.isfinite(x).all())
    out["any_nan"] = bool(torch.isnan(x).any())
    out["known"] = float(torch.tensor(3.0) * 2)
    out["unknown_shape"] = list(torch.nonzero(x > 0).shape)
    p = torch.nn.Parameter(torch.randn(3, device="cuda"))
    opt = torch.optim.Adam([p], lr=0.1)
    p.sum().backward()
    opt.step()
    out["adam_step"] = float(opt.state[p]["step"])
    out["cuda_available"] = torch.cuda.is_available()
    # attention takes a fused kernel, as on a GPU (the math path would hold the score matrix)
    q = torch.randn(1, 2, 4096, 64, device="cuda", dtype=torch.bfloat16)
    torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float())
    out["attention"] = dict(rules.readbacks.attention)
    out["host_reads"] = sum(rules.readbacks.host.values())
print(json.dumps(out))
"""


def python(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        components.missing(components.CXX, "the fake CUDA device is compiled against torch")
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_device_refuses_what_cuda_refuses_and_answers_what_fakes_cannot():
    proc = python("-c", PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    # two devices in one op: CUDA refuses, except a 0-dim CPU tensor (a Python number's)
    assert "cuda:0 and cpu" in out["cpu_operand"] and out["cpu_scalar"] is None
    # mixed precision in a product or a convolution: the meta functions let it through
    assert out["bf16_matmul"].startswith("DeviceRuleError: aten.mm.default: operands of bfloat16")
    assert "bfloat16, float32" in out["bf16_conv"]
    assert out["autocast_dtype"] == "torch.bfloat16"  # autocast runs as on a GPU
    assert out["grad"] == ["cuda:0", "FakeTensor"]
    # values known on the host stay exact (frame numbers, an optimiser's step); unknown reads
    # are a healthy run's (no NaN, all finite); data-shaped ops take their largest shape
    assert out["moving"] == [8] and out["known"] == 6.0 and out["adam_step"] == 1.0
    assert (out["nan_count"], out["all_finite"], out["any_nan"]) == (0, True, False)
    assert out["unknown_shape"] == [16, 2]
    assert out["cuda_available"] is True and out["host_reads"] >= 4
    assert out["attention"] == {"flash": 1, "efficient": 1}


def test_the_shim_must_come_before_torch():
    """Once torch is imported its CUDA hooks are read, so loading the device is refused with
    the way out (and this test process keeps its real, device-less torch)."""
    import torch  # noqa: F401

    with pytest.raises(cuda_shim.ShimError, match="python -m chord.checks.fake_iteration"):
        cuda_shim.load()


def test_a_bad_config_is_one_line_and_exit_2(tmp_path):
    missing = python("-m", "chord.checks.fake_iteration", "--config", str(tmp_path / "no.yaml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert f"config file {tmp_path / 'no.yaml'}: not found" in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: 3\n")
    proc = python("-m", "chord.checks.fake_iteration", "--config", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "tiers" in proc.stderr
    # the config is read before the faked device is built: named even where it cannot be (an
    # empty cache and a compiler that fails)
    broken = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "CXX": "false"}
    proc = python("-m", "chord.checks.fake_iteration", "--config", str(bad), **broken)
    assert proc.returncode == 2 and "tiers" in proc.stderr, proc.stderr
    assert "fake CUDA device" not in proc.stderr


def config_tiers():
    config = settings.validate_config(settings.read_yaml(CONFIG))
    memory = settings.MemoryConfig(**config["memory"])
    method = settings.method_from_mapping({**config["method"], **config["presets"]["cpu_demo"]})
    return {
        name: tiers.apply(tiers.per_gpu(method, tier), memory, tier)
        for name, tier in tiers.parse(config["tiers"]).items()
    }


def traced_as() -> dict[str, str]:
    """{tier: the first tier with its method and memory flags}: at the demo's 128x80 the lowres
    tiers' sizes lower nothing, so they are offload's run (the same iteration: traced once; the
    faked device's capacity, the tier's gpu_mem_gb, is checked against the traced peak in the
    test)."""
    runs = config_tiers()
    return {n: next(f for f, run in runs.items() if run == runs[n]) for n in runs}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Every distinct tier of the workflow's config at the demo's sizes (its cpu_demo preset)."""
    out = tmp_path_factory.mktemp("fake") / "report.json"
    picked = [arg for name in dict.fromkeys(traced_as().values()) for arg in ("--tier", name)]
    proc = python(
        "-m", "chord.checks.fake_iteration", "--config", str(CONFIG), "--preset", "cpu_demo",
        "--json", str(out), *picked,
    )  # fmt: skip
    assert out.is_file(), proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.parametrize("tier", list(config_tiers()))
def test_each_tiers_iteration_runs_on_the_faked_device(report, tier):
    proc, data = report
    rows = {row["tier"]: row for row in data["tiers"]}
    row = rows[traced_as()[tier]]
    assert row["ok"], "".join(row.get("traceback", []))[-3000:]
    # a tier traced as another's run: the same iteration on a device of its own capacity (the
    # faked device refuses an allocation past it), so that run's peak must fit this tier too
    config = settings.validate_config(settings.read_yaml(CONFIG))
    capacity = tiers.parse(config["tiers"])[tier].gpu_mem_gb * 1e9
    assert row["traced_peak_bytes"] <= capacity, (tier, row["traced_peak_bytes"])
    method, memory = config_tiers()[tier]
    assert row["flags"] == dataclasses.asdict(memory)
    assert (row["size"], row["frames"], row["batch"]) == (
        method.size, method.frame_num, method.batch_size,
    )  # fmt: skip
    # both experts: the high-noise one first, the low-noise one late in the schedule
    assert list(row["iterations"]) == ["transformer", "transformer_2"]
    assert row["experts_loaded"] == 2
    mmgp = any(m.startswith("enable_mmgp") for m in row["modelled"])
    assert mmgp == memory.enable_mmgp
    # the traced peak (live device bytes at dispatch) and where it happened; the peak-memory
    # model decides which runs are refused, so it must not promise less than the trace
    phases = row["phases"]
    assert row["traced_peak_bytes"] == max(phases.values()) > phases["resident"] > 0
    assert row["model_peak_bytes"] >= row["traced_peak_bytes"], (row["phases"], row["model_phases"])
    # ... nor drift far above it: the margin docs/BENCHMARKS.md states (the model's analytic DiT
    # activations and what a trace cannot see: workspaces, block rounding, the compositor)
    assert row["model_peak_bytes"] <= MODEL_MARGIN * row["traced_peak_bytes"], row["model_phases"]
    assert proc.returncode == 0 and f"{traced_as()[tier]}: ok" in proc.stdout


ROTATIONS_PROBE = r"""
import json
from chord.checks import cuda_shim
cuda_shim.load()
import torch
from chord.checks import fake_cuda
from chord.core import procrustes

blocks = []
horn = procrustes._horn
procrustes._horn = lambda S: blocks.append((len(S), str(S.device))) or horn(S)
with fake_cuda.fake_cuda():
    S = torch.randn(3, procrustes.CPU_BLOCK, 3, 3, device="cuda")
    R = procrustes.best_rotations(S)
print(json.dumps({"blocks": blocks, "R": [list(R.shape), str(R.device), str(R.dtype)]}))
"""


def test_arap_rotations_on_cuda_solve_the_batch_in_one_block():
    """METHOD §16's rotations on the GPU: Horn's arithmetic over the whole batch at once (the
    CPU's cache-sized blocks would only add kernel launches), every operand on the device."""
    proc = python("-c", ROTATIONS_PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    n = procrustes.CPU_BLOCK
    assert out["blocks"] == [[3 * n, "cuda:0"]]
    assert out["R"] == [[3, n, 3, 3], "cuda:0", "torch.float32"]

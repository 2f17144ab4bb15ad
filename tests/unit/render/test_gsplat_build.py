"""gsplat's kernels, built once per card kind (chord.render.gsplat_backend.load_kernels): a
folder per compute capability, that card's architecture for nvcc, an exclusive lock that makes
concurrent jobs wait for one build, doctor's launch on the card, and a CPU run that says why it
cannot build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.cpp_extension import _get_build_directory

from chord.checks import gpu, report
from chord.cli import main
from chord.render import gsplat_backend as gb
from tests import components
from tests.components import skip_without

ROOT = Path(__file__).resolve().parents[3]


def test_each_capability_builds_in_its_own_folder_for_its_own_architecture(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.0")  # a site's setting, for other cards
    seen = {}

    def fake_build():  # what gsplat's import reads, through torch's own function
        seen["build_dir"] = _get_build_directory(gb.EXTENSION, verbose=False)
        seen["arch"] = os.environ["TORCH_CUDA_ARCH_LIST"]
        return "kernels"

    assert gb.load_kernels((8, 6), builder=fake_build) == "kernels"
    folder = tmp_path / "chord-gsplat" / gb.build_key() / "sm_86"
    assert gb.extensions_dir((8, 6)) == folder
    assert seen == {"build_dir": str(folder / "gsplat_cuda"), "arch": "8.6"}
    # the process's settings are back after the import (other JIT extensions build as before)
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "7.0"
    gb.load_kernels((9, 0), builder=fake_build)
    assert seen == {
        "build_dir": str(tmp_path / "chord-gsplat" / gb.build_key() / "sm_90" / "gsplat_cuda"),
        "arch": "9.0",
    }
    import gsplat

    assert gb.build_key().startswith(f"gsplat{gsplat.__version__}-torch")
    # without TORCH_EXTENSIONS_DIR: under torch's per-user build root
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    from torch.utils.cpp_extension import get_default_build_root

    assert gb.extensions_dir((9, 0)).parent.parent.parent == Path(get_default_build_root())


BUILDER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from chord.render import gsplat_backend as gb

    log = Path(sys.argv[1])

    def fake_build():  # builds (slowly) when no .so is there, else loads it
        start = time.time()
        build = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / gb.EXTENSION
        fresh = not (build / (gb.EXTENSION + ".so")).exists()
        if fresh:
            build.mkdir(parents=True, exist_ok=True)
            time.sleep(3.0)
            (build / (gb.EXTENSION + ".so")).write_text(str(os.getpid()))
        row = {"pid": os.getpid(), "called": called, "start": start, "end": time.time(),
               "built": fresh, "so": (build / (gb.EXTENSION + ".so")).read_text()}
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\\n")

    called = time.time()
    gb.load_kernels((9, 0), builder=fake_build)
    """
)


def test_the_lock_makes_a_second_job_wait_for_the_first_build(tmp_path):
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", BUILDER, str(log)], env=env, cwd=ROOT)
        for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    first, second = sorted(
        (json.loads(line) for line in log.read_text().splitlines()), key=lambda r: r["start"]
    )
    # both asked while the first was building: without the lock they would overlap
    assert second["called"] < first["end"]
    assert second["start"] >= first["end"]  # it waited, then found the build done
    assert (first["built"], second["built"]) == (True, False)
    assert second["so"] == str(first["pid"])


def test_a_cpu_machine_says_why_it_cannot_build(capsys):
    if torch.cuda.is_available():
        components.missing(components.CPU_ONLY, "this machine has a GPU")
    assert main.main(["build-kernels"]) == 2
    out = capsys.readouterr().out
    assert "gsplat build  fail" in out and "sees no CUDA GPU" in out
    assert "compute capability of the card that runs them" in out and "GPU node" in out
    assert "sees no CUDA GPU" in gb.unavailable_reason()


@pytest.fixture
def fake_card(monkeypatch):
    """A CUDA card whose gsplat kernels load; the launch is the test's to decide."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(gb, "unavailable_reason", lambda: None)
    monkeypatch.setattr(gb, "device_capability", lambda *a: (9, 0), raising=False)
    monkeypatch.setattr(
        gb, "kernels_file", lambda: "/ext/sm_80/gsplat_cuda/gsplat_cuda.so", raising=False
    )


def test_doctor_launches_gsplat_on_the_card_and_a_foreign_build_is_a_failing_row(
    fake_card, monkeypatch
):
    launches = []

    def no_kernel_image(device):
        launches.append(device)
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setattr(gpu, "launch_kernels", no_kernel_image)
    for parity in (False, True):  # the training's preflight and chord doctor
        check = gpu.check_renderer("auto", parity=parity, device="cuda:1")
        assert check.status == report.FAIL and check.fatal
        assert "NVIDIA H200 failed: CUDA error: no kernel image" in check.detail
        assert "sm_90" in check.detail and "gsplat_cuda.so" in check.detail
        assert "chord build-kernels --rebuild" in check.remedy
    assert launches == [torch.device("cuda", 1)] * 2
    monkeypatch.setattr(gpu, "launch_kernels", lambda device: launches.append(device))
    check = gpu.check_renderer("auto", parity=False)
    assert check.status == report.PASS and "forward and backward kernels ran" in check.detail
    assert launches[-1] == torch.device("cuda")
    assert gpu.check_renderer("torch", parity=False).status == report.NA


@skip_without(components.CUDA, torch.cuda.is_available(), "gsplat's kernels build for it")
def test_build_kernels_on_a_gpu_builds_for_this_card_and_launches():
    checks = gpu.build_kernels()
    assert [c.status for c in checks] == [report.PASS, report.PASS], report.table(checks)
    tag = gb.capability_tag(gb.device_capability())
    assert f"{tag}/gsplat_cuda/" in (gb.kernels_file() or "") or "csrc" in gb.kernels_file()
    out, alpha = gpu.launch_kernels()
    assert out.shape == (1, 48, 64, 3) and float(alpha.max()) > 0

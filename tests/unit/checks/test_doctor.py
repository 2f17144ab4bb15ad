"""`chord doctor` and the training's preflight: one table of pass / fail / n/a, each failure
with its remedy, and a non-zero exit where something would fail on the GPU node."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch

from chord.checks import capacity, preflight, report, teacher
from chord.cli import main
from chord.config import settings
from chord.guidance import tiny_models, tiny_vae_check
from chord.resources import machine, peak_memory
from tests import components
from tests.components import skip_without
from tests.conftest import REPO, write_config

pytestmark = skip_without(components.CPU_ONLY, not torch.cuda.is_available(), "checks the CPU rows")


def rows(text: str) -> dict[str, str]:
    """{check: status} of a printed table (first row of each check)."""
    out = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition("  ")
        if name.strip() and name.strip() != "check":
            out.setdefault(name.strip(), rest.split()[0])
    return out


def test_the_demo_config_passes_here_and_says_what_needs_a_gpu(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main.main(["doctor"]) == 0
    out = capsys.readouterr().out
    status = rows(out)
    assert status == {
        "config": "pass",
        "cuda": "n/a",
        "gsplat": "n/a",
        "wan folder": "n/a",
        "tiny vae": "n/a",
        "gpu memory": "n/a",
        "allocator": "pass",
        "disk": "pass",
    }
    assert "needs a CUDA GPU (gsplat's kernels are CUDA-only)" in out


@pytest.fixture(scope="module")
def comparisons():
    """{digest of the clip, the Tiny VAE's and the Wan VAE's weights: result} of the latent-scale
    comparison, which the doctor and the preflight run on every call (about a second on a CPU):
    a pure function of those, computed once per distinct input for the module's tests."""
    return {}


@pytest.fixture(autouse=True)
def compare_once(comparisons, monkeypatch):
    compare = tiny_vae_check.compare_with_full_vae

    def cached(video, tiny, vae):
        digest = hashlib.sha256()
        tensors = {"video": video, "mean": tiny.latents_mean, "std": tiny.latents_std}
        tensors |= {f"tiny.{k}": t for k, t in tiny.state_dict().items()}
        tensors |= {f"vae.{k}": t for k, t in vae.state_dict().items()}
        for name, t in tensors.items():
            t = t.detach().cpu()
            digest.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        key = digest.hexdigest()
        if key not in comparisons:
            comparisons[key] = compare(video, tiny, vae)
        return comparisons[key]

    monkeypatch.setattr(tiny_vae_check, "compare_with_full_vae", cached)


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    return tiny_models.write_tiny_wan(tmp_path_factory.mktemp("wan") / "Wan2.2-I2V-A14B-Tiny")


@pytest.fixture(scope="module")
def tiny_files(wan_folder, tmp_path_factory):
    """Tiny VAE files fitted to the tiny Wan folder's VAE in each latent convention:
    {False: raw latents (as lighttaew2_1), True: normalised latents (as taew2_1)}."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        normalized: tiny_models.write_tiny_vae(
            root / f"tiny_{normalized}.safetensors", wan_folder, normalized=normalized
        )
        for normalized in (False, True)
    }


@pytest.fixture
def wan_config(tmp_path, wan_folder, tiny_files, monkeypatch):
    """A wan config over a copy of the tiny Wan folder, with a Tiny VAE file (raw latents, as
    lighttaew2_1: the shipped tiny_vae_normalize true is right for it)."""
    monkeypatch.chdir(tmp_path)
    folder = shutil.copytree(wan_folder, tmp_path / "wan")
    tiny = shutil.copy(tiny_files[False], tmp_path / "lighttaew2_1.safetensors")
    guidance = {"backend": "wan", "ckpt_dir": str(folder), "tiny_vae_path": str(tiny)}
    rows_ = [{"scene": "hop", "data": "resources/demo/hop", "prompt": "a block hops"}]
    path = write_config(
        tmp_path / "config", rows_, guidance=guidance, method={"use_tiny_vae": True}
    )
    return path, folder, tiny


def doctor_run(config, capsys):
    code = main.main(["doctor", "--config", str(config)])
    return code, capsys.readouterr().out


def test_a_complete_wan_folder_and_tiny_vae_pass(wan_config, capsys):
    config, _, _ = wan_config
    code, out = doctor_run(config, capsys)
    status = rows(out)
    assert code == 0, out
    assert status["wan folder"] == "pass" and status["tiny vae"] == "pass"
    assert "experts 1 layers x 16" in out  # the model the folder holds, not A14B
    assert status["cuda"] == "n/a"  # a small test model runs on a CPU
    assert status["host ram"] == "pass" and "tier full" in out


def test_a_wan_folder_without_transformer_2_fails_naming_it(wan_config, capsys):
    config, folder, _ = wan_config
    shutil.rmtree(folder / "transformer_2")
    code, out = doctor_run(config, capsys)
    assert code == 2 and rows(out)["wan folder"] == "fail"
    assert "missing: transformer_2/config.json, transformer_2/ weights" in out
    assert "fix: copy the whole Wan2.2-I2V-A14B-Diffusers folder" in out


def test_a_tiny_vae_file_with_other_keys_fails_naming_them(wan_config, capsys):
    from safetensors.torch import save_file

    config, _, tiny = wan_config
    save_file({"decoder.weight": torch.zeros(2)}, str(tiny))  # a decoder, no encoder
    code, out = doctor_run(config, capsys)
    assert code == 2 and rows(out)["tiny vae"] == "fail"
    assert "missing encoder keys: encoder.0.bias, encoder.0.weight" in out and "more)" in out


@pytest.mark.parametrize("normalized", [False, True])
def test_the_tiny_vaes_latent_scale_is_checked_with_the_wan_vae(normalized, wan_folder, tiny_files):
    """taew2_1 has lighttaew2_1's keys but emits normalised latents: with tiny_vae_normalize
    true the DiT would see them normalised twice. Each kind of file (fitted to the Wan VAE in
    its convention) passes with the right setting and fails with the other, naming the file
    and the fix; the keys alone pass both."""
    path = tiny_files[normalized]
    for setting in (True, False):
        guidance = settings.guidance_from_mapping(
            {
                "backend": "wan",
                "ckpt_dir": str(wan_folder),
                "tiny_vae_path": str(path),
                "tiny_vae_normalize": setting,
            }
        )
        check = teacher.check_tiny_vae(
            guidance, [settings.method_from_mapping({"use_tiny_vae": True})]
        )
        right = setting != normalized  # raw latents are to be normalised, normalised ones not
        assert check.status == ("pass" if right else "fail"), check
        assert str(path) in check.detail and "on the test pattern" in check.detail
        if not right:
            twice = "normalised twice" if setting else "unnormalised"
            assert twice in check.detail
            assert f"set guidance.tiny_vae_normalize: {str(not setting).lower()}" in check.remedy


def test_doctor_checks_the_latent_scale_on_the_reference_render(wan_config, tiny_files, capsys):
    """With a reference render in the results, the check encodes a still of it; a taew2_1-like
    file under the shipped tiny_vae_normalize true fails the doctor (exit 2)."""
    from PIL import Image

    config, _, tiny = wan_config
    png = config.parent / "results" / "hop" / "reference" / "ref.png"
    png.parent.mkdir(parents=True)
    g = torch.Generator().manual_seed(1)
    pixels = torch.nn.functional.interpolate(torch.rand(1, 3, 6, 10, generator=g), size=(48, 80))
    Image.fromarray((pixels[0] * 255).byte().permute(1, 2, 0).numpy()).save(png)
    code, out = doctor_run(config, capsys)
    assert code == 0 and rows(out)["tiny vae"] == "pass", out
    assert f"on a still of {png} its latents are raw Wan 2.1 latents" in out
    shutil.copy(tiny_files[True], tiny)
    code, out = doctor_run(config, capsys)
    assert code == 2 and rows(out)["tiny vae"] == "fail"
    assert "already normalised latents" in out and "normalised twice" in out
    assert "fix: set guidance.tiny_vae_normalize: false for this file" in out


def test_an_expert_with_another_interface_fails(wan_config, capsys):
    import json

    config, folder, _ = wan_config
    path = folder / "transformer" / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({**cfg, "in_channels": 48}))  # e.g. the TI2V-5B layout
    code, out = doctor_run(config, capsys)
    assert code == 2 and "transformer/config.json: in_channels 48, expected 36" in out


def test_memory_against_the_model_on_a_declared_gpu(wan_config, capsys, tmp_path):
    """With gpu_mem_gb from a profile, each scene's tier is checked against the model."""
    import yaml

    config, _, _ = wan_config
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"gpu_mem_gb": 80}))
    assert main.main(["doctor", "--config", str(config), "--configfile", str(small)]) == 0
    out = capsys.readouterr().out
    # read as the least an 80 GB card has: 80 x 10^9 bytes
    assert rows(out)["gpu memory"] == "pass" and "fits 74.5 GiB" in out


ALLOCATOR_ON = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def preflight_kwargs(tmp_path, wan_config) -> dict:
    """preflight.preflight's arguments for a small scene of the Wan config on tier full, on the
    CPU, with the production allocator."""
    from chord.config import settings

    _, folder, tiny = wan_config
    return dict(
        method=settings.method_from_mapping({"use_tiny_vae": True}),
        memory=settings.memory_from_mapping({}),
        guidance=settings.guidance_from_mapping(
            {"backend": "wan", "ckpt_dir": str(folder), "tiny_vae_path": str(tiny)}
        ),
        device="cpu",
        render_backend="auto",
        tier="full",
        host_mem_gb=None,
        gaussians=1000,
        dynamic_gaussians=500,
        control_point_count=60,
        checkpoint_dir=tmp_path / "ckpt",
        env=ALLOCATOR_ON,
    )


def test_preflight_stops_a_training_that_would_fail_later(tmp_path, wan_config):
    _, folder, _ = wan_config
    kw = preflight_kwargs(tmp_path, wan_config)
    checks = {c.name: c.status for c in preflight.preflight(**kw)}
    assert checks["wan folder"] == checks["tiny vae"] == checks["host ram"] == "pass"
    # a job with less host RAM than the model's (one expert + the process) fails at once
    with pytest.raises(report.PreflightError, match="host ram: .* 4 GiB available"):
        preflight.preflight(**{**kw, "host_mem_gb": 4})
    # the allocator turned off by the user: a warning, not a stop
    off = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    assert {c.name: c.status for c in preflight.preflight(**{**kw, "env": off})}["allocator"] == (
        "fail"
    )
    shutil.rmtree(folder / "transformer_2")
    with pytest.raises(report.PreflightError, match="wan folder: .*transformer_2"):
        preflight.preflight(**kw)


def test_disk_need_counts_checkpoints_and_the_ply_sequence(tmp_path):
    m = settings.method_from_mapping({})
    assert 1 * peak_memory.MiB < capacity.checkpoint_bytes(m, 60) < 100 * peak_memory.MiB
    # one 3DGS PLY per frame: 41 frames of 200k degree-0 Gaussians (17 floats each)
    assert capacity.export_bytes(m, 200_000, imported=False) > 200_000 * 68 * 41
    full = capacity.check_disk(tmp_path / "not" / "yet", 10**18, "everything")
    assert full.status == "fail" and str(tmp_path) in full.detail


GiB = peak_memory.GiB
V1_NO_LIMIT = "9223372036854771712"  # what cgroup v1 reports for no limit


def fake_machine(root, cgroup_line: str, limits: dict[str, str], mem_total_gib: int = 64):
    """A procfs and cgroup tree under ``root``: MemTotal, this process's /proc/self/cgroup and
    ``{file under the cgroup mount: content}``; returns (proc, cgroup) for host_bytes."""
    proc, cgroup = root / "proc", root / "sys/fs/cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(
        f"MemTotal:       {mem_total_gib * 1024 * 1024} kB\nMemFree:        1024 kB\n"
    )
    (proc / "self/cgroup").write_text(cgroup_line + "\n")
    for name, text in limits.items():
        (cgroup / name).parent.mkdir(parents=True, exist_ok=True)
        (cgroup / name).write_text(text + "\n")
    return proc, cgroup


def test_host_ram_is_the_slurm_jobs_cgroup_limit_under_cgroup_v2(tmp_path):
    """Under cgroup v2 a Slurm job's --mem is the memory.max of the job's cgroup (the one
    /proc/self/cgroup names, or a parent of it), not of the mount's root."""
    job = "system.slice/slurmstepd.scope/job_42"
    proc, cgroup = fake_machine(
        tmp_path,
        f"0::/{job}/step_0/user/task_0",
        {
            f"{job}/memory.max": str(24 * GiB),
            f"{job}/step_0/memory.max": "max",
            f"{job}/step_0/user/task_0/memory.max": "max",
            "system.slice/memory.max": "max",
        },
    )
    assert machine.host_bytes({}, proc=proc, cgroup=cgroup) == 24 * GiB
    # a parent's lower limit binds the job too: the least along the path
    (cgroup / "system.slice/memory.max").write_text(str(20 * GiB))
    assert machine.host_bytes({}, proc=proc, cgroup=cgroup) == 20 * GiB
    # no limit anywhere: the machine's RAM; a limit above it: still the machine's RAM
    for f in (f"{job}/memory.max", "system.slice/memory.max"):
        (cgroup / f).write_text("max")
    assert machine.host_bytes({}, proc=proc, cgroup=cgroup) == 64 * GiB
    (cgroup / job / "memory.max").write_text(str(512 * GiB))
    assert machine.host_bytes({}, proc=proc, cgroup=cgroup) == 64 * GiB


def test_host_ram_is_the_jobs_memory_cgroup_under_cgroup_v1(tmp_path):
    proc, cgroup = fake_machine(
        tmp_path,
        "4:memory:/slurm/uid_1000/job_42/step_batch\n3:cpuset:/slurm/uid_1000/job_42",
        {
            "memory/memory.limit_in_bytes": V1_NO_LIMIT,
            "memory/slurm/memory.limit_in_bytes": V1_NO_LIMIT,
            "memory/slurm/uid_1000/job_42/memory.limit_in_bytes": str(12 * GiB),
            "memory/slurm/uid_1000/job_42/step_batch/memory.limit_in_bytes": V1_NO_LIMIT,
            # another job's cgroup on the same node is not ours
            "memory/slurm/uid_1000/job_41/memory.limit_in_bytes": str(2 * GiB),
        },
    )
    assert machine.host_bytes({}, proc=proc, cgroup=cgroup) == 12 * GiB


def test_host_ram_is_the_slurm_jobs_request_from_its_environment(tmp_path):
    """Where no cgroup limits the job (Slurm without ConstrainRAMSpace), its request does:
    SLURM_MEM_PER_NODE, or per CPU times the CPUs on the node, in MiB; 0 is the whole node."""
    proc, cgroup = fake_machine(tmp_path, "0::/", {})
    host = lambda env: machine.host_bytes(env, proc=proc, cgroup=cgroup)  # noqa: E731
    assert host({}) == 64 * GiB
    assert host({"SLURM_MEM_PER_NODE": "16000"}) == 16000 * 2**20
    assert host({"SLURM_MEM_PER_CPU": "4000", "SLURM_CPUS_ON_NODE": "3"}) == 12000 * 2**20
    assert host({"SLURM_MEM_PER_GPU": "30000", "SLURM_GPUS_ON_NODE": "2"}) == 60000 * 2**20
    assert host({"SLURM_MEM_PER_NODE": "0"}) == 64 * GiB
    assert host({"SLURM_MEM_PER_NODE": "100000000"}) == 64 * GiB  # the node's RAM bounds it


def test_the_preflight_counts_the_slurm_jobs_memory_not_the_nodes(tmp_path, wan_config):
    """A training whose Slurm job asked for less host RAM than the model's need stops at its
    start, though the node has more."""
    kw = preflight_kwargs(tmp_path, wan_config)
    assert {c.name: c.status for c in preflight.preflight(**kw)}["host ram"] == "pass"
    with pytest.raises(report.PreflightError, match="host ram: .* 4 GiB available"):
        preflight.preflight(**{**kw, "env": {**ALLOCATOR_ON, "SLURM_MEM_PER_NODE": "4096"}})


def test_the_gpu_memory_row_shows_the_contact_loss_where_it_is_on(wan_config, capsys, tmp_path):
    """Issue 36: with lambda_contact the memory row names the contact loss's memory (the
    worst-case grid, resident, and its graph in the regularisers); without it, no such words."""
    import yaml

    from chord.motion import contact
    from chord.plan import scene_plan
    from chord.resources import job_size

    config, _, _ = wan_config
    card = tmp_path / "card.yaml"
    off = {"lambda_contact": 0.0, "lambda_support": 0.0}
    card.write_text(yaml.safe_dump({"gpu_mem_gb": 80, "method": off}))
    assert main.main(["doctor", "--config", str(config), "--configfile", str(card)]) == 0
    assert "contact loss" not in capsys.readouterr().out
    on = tmp_path / "contact.yaml"
    on.write_text(yaml.safe_dump({"gpu_mem_gb": 80, "method": {"lambda_contact": 1.0}}))
    assert main.main(["doctor", "--config", str(config), "--configfile", str(on)]) == 0
    out = capsys.readouterr().out
    conf = settings.load_file(config, on)
    dynamic = len(scene_plan.scene(conf, "hop").dynamic)
    method = conf.scenes["hop"].method
    points = dynamic * contact.CONTACT_SAMPLES  # the evaluation's surface samples per object
    assert job_size.contact_points(method, scene_plan.scene(conf, "hop").roles) == points > 0
    grid = 4 * ((128 + 2 * 4 + 2) ** 3 + points)  # a cube's nodes: no mesh is read
    per_point = 12 + 12 + 4 + 12 + peak_memory.CPU_PROXY["deform_per_gaussian"]
    graph = per_point * method.frame_num * points
    MiB = peak_memory.MiB
    line = f"contact loss {grid / MiB:.1f} MiB resident (grid), {graph / MiB:.1f} MiB in the"
    assert rows(out)["gpu memory"] == "pass" and line in out, out

"""The teacher preview's Slurm request (dry runs of the slurm profile): the GPU kind and
partition of the scene's training tier, and the host RAM of one Wan expert from the memory
model, not the tier's ceiling."""

from __future__ import annotations

import pytest
import yaml

from chord.config import settings
from chord.resources import job_memory, peak_memory, tiers
from tests.components import require_slurm_plugin
from tests.conftest import REPO
from tests.workflow.test_scale import snakemake, wan_workdir


def resources(stdout: str, rule: str) -> dict[str, str]:
    lines = stdout.splitlines()
    heads = (f"rule {rule}:", f"checkpoint {rule}:")  # the trainings are checkpoints
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(heads))
    line = next(x for x in lines[start:] if x.strip().startswith("resources:"))
    items = line.split("resources:")[1].split(", ")
    return dict(item.strip().split("=", 1) for item in items)


@pytest.mark.parametrize(("gpu", "tier"), [(80, "full"), (24, "offload")])
def test_the_preview_job_asks_for_its_tiers_gpu_kind_and_one_experts_host_ram(tmp_path, gpu, tier):
    require_slurm_plugin()
    work = wan_workdir(tmp_path / "w")
    profile = ["--workflow-profile", str(work / "wf/profiles/slurm")]
    targets = ["results/hop/preview/teacher.mp4", "results/hop/train/coarse.pt"]
    out = snakemake(work, *profile, "-n", *targets, "--config", f"gpu_mem_gb={gpu}").stdout
    preview, train = resources(out, "teacher_preview"), resources(out, "train_coarse")
    site = yaml.safe_load((REPO / "profiles/slurm/site.yaml").read_text())["tiers"][tier]
    assert preview["tier"] == train["tier"] == tier
    assert preview["gpu_model"] == site["gpu_model"]
    assert preview["slurm_partition"] == site["slurm_partition"]
    # one A14B expert in bf16 with a 10% margin, not the two the pipeline once held
    expert_mib = peak_memory.dit_params(peak_memory.A14B) * 2 / peak_memory.MiB
    assert 1.1 * expert_mib < int(preview["mem_mb"]) < 2 * expert_mib
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    spec = tiers.parse(conf["tiers"])[tier]
    flags = {**conf["memory"], **spec.flags}
    # no Wan folder there: A14B's shapes; one expert (+ mmgp's staging) and 10%
    expected = job_memory.preview_mem_mb(
        settings.memory_from_mapping(flags), ceiling_mb=spec.mem_mb, model=peak_memory.A14B
    )
    assert int(preview["mem_mb"]) == expected < spec.mem_mb

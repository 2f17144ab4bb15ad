"""Multi-GPU tiers (``gpus: N``): parsing and escalation order, the batch each GPU holds, the
memory model per GPU and the job's host RAM, ``auto``, the batch_size check before any job
starts, and the N GPUs a job takes on a workstation."""

from __future__ import annotations

import pytest
import yaml

from chord.config import result_keys as rk
from chord.config import settings
from chord.resources import gpus, job_size, peak_memory, tiers
from tests.conftest import REPO

MEM = settings.memory_from_mapping({})
SPLIT = {
    "split_sds_backward": True,
    "split_render_backward": True,
    "split_render_chunk_size": 21,
    "checkpoint_tiny_vae": True,
}
OFFLOAD = {**SPLIT, "enable_mmgp": True}
# a site of 1x80 GB, 2x48 GB and 4x24 GB nodes
SITE = {
    "full": {"gpu_mem_gb": 80},
    "duo48": {"gpu_mem_gb": 48, "gpus": 2, **SPLIT},
    "quad24": {"gpu_mem_gb": 24, "gpus": 4, "host_mem_gb": 256, **OFFLOAD},
    "offload": {"gpu_mem_gb": 24, "host_mem_gb": 96, **OFFLOAD},
}
ROLES = {"obj_0": "dynamic", "obj_1": "static"}


def node(gib, count=1):
    """A node of ``count`` GPUs that report ``gib`` GiB each."""
    return gpus.Node(count, gpus.Card(f"a {gib} GiB GPU", gib * 1024))


def documented(**values):
    """832*480, 41 frames, batch 4, the Tiny VAE (two objects of 100k Gaussians)."""
    base = {"size": "832*480", "frame_num": 41, "batch_size": 4, "use_tiny_vae": True}
    return settings.method_from_mapping({**base, **values})


def test_gpus_is_a_tier_key_not_a_memory_flag():
    t = tiers.parse(SITE)
    assert [t[n].gpus for n in t] == [1, 2, 4, 1]
    assert t["quad24"].flags == OFFLOAD and t["duo48"].flags == SPLIT
    with pytest.raises(settings.ConfigError, match=r"tiers.none.gpus: 0"):
        tiers.parse({"none": {"gpu_mem_gb": 24, "gpus": 0}})
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["tiers"] = SITE
    settings.validate_config(conf)  # the schema knows gpus (and fills its default)
    assert conf["tiers"]["full"]["gpus"] == 1
    conf["tiers"] = {"x": {"gpu_mem_gb": 24, "gpus": 1.5}}
    with pytest.raises(settings.ConfigError, match="gpus"):
        settings.validate_config(conf)


def test_the_escalation_order_is_by_memory_per_gpu():
    """A tier's gpu_mem_gb is per GPU; the GPU count does not enter the order: 4x24 GB sits
    with the 24 GB tiers (before them: auto takes the first that fits), not above 48 GB."""
    tiers.parse(SITE)
    with pytest.raises(settings.ConfigError, match="fullest first"):
        tiers.parse({"offload": SITE["offload"], "duo48": SITE["duo48"]})
    t = tiers.parse(SITE)
    assert tiers.for_attempt("quad24", 2, t, {"quad24"}) == "offload"  # same flags, one GPU
    assert tiers.for_attempt("duo48", 2, t, {"duo48"}) == "quad24"


def test_each_gpu_trains_its_share_of_the_batch():
    t = tiers.parse(SITE)
    m = documented()
    assert tiers.per_gpu(m, t["full"]) is m
    assert tiers.per_gpu(m, t["duo48"]).batch_size == 2
    assert tiers.per_gpu(m, t["quad24"]).batch_size == 1
    assert rk.training_hash(
        tiers.per_gpu(m, t["quad24"]), settings.guidance_from_mapping({}), 4
    ) == (
        rk.training_hash(m, settings.guidance_from_mapping({}))
    )  # 4 ranks of 1 video hash as one process of 4
    with pytest.raises(settings.ConfigError) as err:
        tiers.per_gpu(documented(batch_size=2), t["quad24"], scene="s")
    msg = str(err.value)
    assert msg.startswith("scene s: tier quad24 trains on 4 GPUs (gpus: 4)")
    assert "method.batch_size 2 is not a multiple of 4" in msg


def test_every_tier_a_scene_may_run_on_must_divide_its_batch_at_dag_build():
    """base() (the workflow's scene_tier) checks the start tier and each tier a retry may move
    to, so the error comes before any job, not on a retry hours later."""
    t = tiers.parse(SITE)
    assert tiers.start("offload", t, None, method=documented(batch_size=3)).tier == "offload"
    with pytest.raises(settings.ConfigError) as err:
        tiers.start("full", t, None, method=documented(batch_size=3))
    assert "tier duo48, which an out-of-memory retry from tier full may reach," in str(err.value)
    with pytest.raises(settings.ConfigError, match="tier quad24 trains on 4 GPUs"):
        tiers.start("quad24", t, None, method=documented(batch_size=2))
    assert tiers.start("full", t, None, method=documented(batch_size=8)).tier == "full"


def test_the_model_predicts_per_gpu_with_the_gpus_share_of_the_batch():
    t = tiers.parse(SITE)
    m = documented()
    e = job_size.estimate(m, MEM, t["quad24"], 200_000, 100_000)
    _, mem = tiers.apply(m, MEM, t["quad24"])
    one = peak_memory.estimate(
        mem, width=832, height=480, frames=41, batch=1, gaussians=200_000, dynamic_gaussians=100_000
    )
    assert (e["batch"], e["gpus"]) == (1, 4)
    assert e["gpu_bytes"] == one["gpu_bytes"]  # each GPU: one video's peak
    assert e["host_bytes"] == 4 * one["host_bytes"]  # four processes, each with its expert
    single = job_size.estimate(m, MEM, t["offload"], 200_000, 100_000)
    assert single["batch"] == 4 and e["gpu_bytes"] < single["gpu_bytes"]  # fewer B-sized terms
    text = peak_memory.describe(e)
    assert "per GPU (1 video(s) on each of 4)" in text and "(4 ranks)" in text
    # without mmgp the expert alone (26.6 GiB in bf16) overflows 24 GB, whatever the batch
    lean = {k: v for k, v in OFFLOAD.items() if k != "enable_mmgp"}
    quad_plain = tiers.Tier("q", 24, gpus=4, flags=lean)
    fits = job_size.scene_fits(m, MEM, ROLES, node(24, 4), backend="wan")
    assert fits(t["quad24"]) and not fits(quad_plain)


def test_auto_picks_a_multi_gpu_tier_that_fits():
    t = tiers.parse(SITE)
    m = documented()
    # a multi-GPU tier where the node has its GPUs; with fewer, the next tier that fits
    cases = [((80, 1), "full"), ((48, 2), "duo48"), ((24, 4), "quad24"), ((24, 2), "offload")]
    for (gib, count), expected in cases:
        fits = job_size.scene_fits(m, MEM, ROLES, node(gib, count), backend="wan")
        assert tiers.auto(t, node(gib, count), fits, method=m) == expected
        assert tiers.start("auto", t, node(gib, count), fits, method=m).tier == expected
    choice = tiers.choose(t, node(24, 2), fits, method=m)
    assert ("quad24", "needs 4 GPUs, the node has 2") in choice.skipped
    # batch_size 2 on the 24 GB site: quad24 would split it 4 ways, an error before any job
    two = documented(batch_size=2)
    fits = job_size.scene_fits(two, MEM, ROLES, node(24, 4), backend="wan")
    with pytest.raises(settings.ConfigError, match="batch_size 2 is not a multiple of 4"):
        tiers.start("auto", t, node(24, 4), fits, method=two)


def test_a_multi_gpu_job_asks_for_every_ranks_host_ram():
    t = tiers.parse(SITE)
    m = documented()
    quad = job_size.job_request(t["quad24"], backend="wan", method=m, mem=MEM, roles=ROLES)
    one = job_size.job_request(t["offload"], backend="wan", method=m, mem=MEM, roles=ROLES)
    assert one["mem_mb"] < quad["mem_mb"] <= t["quad24"].mem_mb
    assert quad["mem_mb"] == pytest.approx(4 * one["mem_mb"], rel=0.01)  # 4 x ~46 GiB
    assert quad["cpus_per_gpu"] == one["cpus_per_gpu"] == 8  # per GPU already
    oracle = job_size.job_request(t["quad24"], backend="oracle")
    assert oracle["mem_mb"] == 4 * job_size.ORACLE_HOST_MB and oracle["cpus_per_gpu"] == 1


def test_the_shipped_config_trains_on_one_gpu_and_its_commented_example_fits_24_gb():
    """The default tiers are single-GPU. The commented quad24 example, uncommented where it
    stands, keeps the escalation order, and the model accepts it for one 832x480 video per 24
    GB GPU: auto picks it on a 24 GB site, before offload."""
    text = (REPO / "config/config.yaml").read_text()
    conf = yaml.safe_load(text)
    settings.validate_config(conf)
    assert {t.gpus for t in tiers.parse(conf["tiers"]).values()} == {1}
    lines = text.splitlines()
    start = lines.index("  # quad24:  # a node of 4 x 24 GB; batch_size 4: one video per GPU")
    block = [lines[start].replace("  # ", "  ", 1)]
    for line in lines[start + 1 :]:
        if not line.startswith("  #   "):
            break
        block.append("    " + line[len("  #   ") :])
    conf = yaml.safe_load("\n".join([*lines[:start], *block, *lines[start + len(block) :]]))
    settings.validate_config(conf)
    t = tiers.parse(conf["tiers"])
    assert list(t)[:4] == ["full", "split", "quad24", "offload"]
    assert t["quad24"].gpus == 4 and t["quad24"].flags == {
        "enable_mmgp": True,
        "checkpoint_tiny_vae": True,
    }
    m = documented()
    fits = job_size.scene_fits(m, MEM, ROLES, node(24, 4), backend="wan")
    assert tiers.start("auto", t, node(24, 4), fits, method=m).tier == "quad24"
    e = job_size.estimate(m, MEM, t["quad24"], 200_000, 100_000)
    need = e["reserved_bytes"] / peak_memory.GiB + peak_memory.CUDA_CONTEXT_GIB
    assert 19 < need < 22  # the README's 20.4 GiB
    request = job_size.job_request(t["quad24"], backend="wan", method=m, mem=MEM, roles=ROLES)
    assert request["mem_mb"] < t["quad24"].mem_mb  # host_mem_gb covers the four ranks


def test_a_job_of_several_gpus_holds_them_all_or_waits(tmp_path):
    """Two 2-GPU jobs on a 4-GPU workstation get disjoint pairs; a third waits until one ends;
    a job that sees no more GPUs than it needs (a Slurm allocation) keeps them all."""
    import threading

    envs = [{"CUDA_VISIBLE_DEVICES": "0,1,2,3"} for _ in range(3)]
    with gpus.job_gpus(envs[0], 2, tmp_path) as a, gpus.job_gpus(envs[1], 2, tmp_path) as b:
        assert len(a) == len(b) == 2 and not set(a) & set(b)
        assert envs[0]["CUDA_VISIBLE_DEVICES"] == ",".join(a)
        got = []

        def third():
            with gpus.job_gpus(envs[2], 2, tmp_path) as c:
                got.append(c)

        waiter = threading.Thread(target=third)
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive() and not got  # no two free GPUs: it waits, holding none
    waiter.join(timeout=10)
    assert got and len(got[0]) == 2
    slurm = {"CUDA_VISIBLE_DEVICES": "4,5"}
    with gpus.job_gpus(slurm, 2, tmp_path) as held:
        assert held == ["4", "5"] and slurm["CUDA_VISIBLE_DEVICES"] == "4,5"
    with gpus.job_gpu({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) as none:
        assert none is None


def test_the_tier_table_command_prints_the_peak_per_gpu(tmp_path, capsys):
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["tiers"] = SITE
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    assert job_size.main(["--config", str(path)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["quad24"][1:3] == ["4", "1"]  # gpus, videos per GPU
    assert rows["duo48"][1:3] == ["2", "2"] and rows["full"][1:3] == ["1", "4"]
    assert rows["quad24"][6:9] == ["8.0G", "24G", "yes"] and rows["quad24"][9] == "184G"
    job_size.main(["--config", str(path), "--batch", "2"])
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["quad24"][8] == "batch"  # 2 videos do not split over 4 GPUs


def test_a_training_job_applies_its_tier_once_for_the_job_and_its_ranks():
    """tiers.training_job: the tier's size and flags for the job, batch_size / gpus for each
    rank, and one hash for both (the checkpoints a single-GPU tier of the scene shares)."""
    t = tiers.parse({**SITE, "quad_low": {**SITE["quad24"], "size": "416*240"}})
    m = settings.method_from_mapping({"size": "832*480", "batch_size": 4})
    job = tiers.training_job(m, MEM, t["quad_low"], scene="s")
    assert job.method.size == "416*240" and job.method.batch_size == 4
    assert job.rank_method.size == "416*240" and job.rank_method.batch_size == 1
    assert {k: getattr(job.memory, k) for k in OFFLOAD} == OFFLOAD
    guidance = settings.guidance_from_mapping({})
    assert job.config_hash(guidance) == rk.training_hash(job.rank_method, guidance, 4)
    assert job.config_hash(guidance) != tiers.training_job(m, MEM, t["full"]).config_hash(guidance)
    solo = tiers.training_job(m, MEM, t["full"])
    assert solo.rank_method == solo.method == m  # a lower size only: 832*480 stays
    with pytest.raises(settings.ConfigError, match="scene s: tier quad24"):
        tiers.training_job(
            settings.method_from_mapping({"batch_size": 3}), MEM, t["quad24"], scene="s"
        )

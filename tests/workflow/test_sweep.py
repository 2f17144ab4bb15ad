"""Seed sweeps through the workflow: a 3-seed dry run plans one training per seed and one of
everything before it; a 2-seed sweep of the hop demo runs, its seeds differ, the selection
follows the config's rule, the report has both seeds, and changing the rule or adding a
seed re-runs only what it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from chord.core import media
from chord.plan import results_layout
from chord.training import progress
from tests.conftest import REPO
from tests.workflow.test_workflow import demo_workdir, planned_jobs, snakemake

UPSTREAM = ("demo_hop", "demo_sway", "ingest", "reference", "condition")
PER_RUN = ("train_coarse", "export", "viewer", "evaluate")


def sweep_sheet(work, seeds: str, scenes=("hop",)) -> None:
    """The sheet's rows of ``scenes`` with a ``seeds`` cell (in place of one they had)."""
    table = [line.split("\t") for line in (work / "config/scenes.tsv").read_text().splitlines()]
    keep = [i for i, name in enumerate(table[0]) if name != "seeds"]
    rows = [[row[i] for i in keep] + [seeds] for row in table[1:] if row[0] in scenes]
    header = [table[0][i] for i in keep] + ["seeds"]
    (work / "config/scenes.tsv").write_text("".join("\t".join(r) + "\n" for r in [header, *rows]))


def test_a_three_seed_dry_run_trains_each_seed_and_shares_the_stages_before(tmp_path):
    work = demo_workdir(tmp_path)
    sweep_sheet(work, "0 1 2", scenes=("hop", "sway"))
    jobs = planned_jobs(snakemake(work, "-n"))
    for rule in ("ingest", "reference", "condition"):
        assert jobs[rule] == 2, rule  # once per scene
    for rule in PER_RUN:
        assert jobs[rule] == 6, rule  # once per scene and seed
    assert jobs["sweep"] == 2 and jobs["aggregate"] == 1


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """hop with seeds 0 and 1 run to the end, as small as still shows two seeds' motions
    apart (the sweep, not the method, is under test): a tenth of the demo's iterations (20
    of 30 run, with its early stop) on fewer Gaussians, at a quarter of the demo's pixels
    (their last frames differ by 10x the codec's noise, against 11x at the demo's size)."""
    work = demo_workdir(tmp_path_factory.mktemp("sweep"))
    sweep_sheet(work, "0 1")
    conf = yaml.safe_load((work / "config/config.yaml").read_text())
    # without the contact loss: its pull on the first steps' dip into the table damps both
    # seeds' 20-iteration motions alike (measured: their last frames then differ by 9.4x the
    # codec's noise, against 11.7x without); what separates seeds is the sweep's business here
    small = {"iterations": 30, "save_interval": 10, "back_iter": 1, "lambda_contact": 0.0}
    sizes = {"size": "64*32", "export_size": "128*64"}
    conf["scene_overrides"] = {
        "hop": {**small, **sizes, "gs_init_num": 800, "surface_target_num": 500}
    }
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    snakemake(work)
    return work


def test_the_seeds_of_a_sweep_train_differently(swept):
    results = swept / "results"
    docs = {
        s: json.loads(results_layout.metrics_json(results, f"hop/seed_{s}").read_text())
        for s in (0, 1)
    }
    assert docs[0]["seed"] == 0 and docs[1]["seed"] == 1
    # the same rest pose (the shared upstream): frame 0 renders as ref.png in both
    assert docs[0]["psnr_frame0"] == docs[1]["psnr_frame0"] == 100.0
    frames = {
        s: media.read_mp4(results_layout.ref_view_mp4(results, f"hop/seed_{s}"))[0] for s in (0, 1)
    }
    diff = np.abs(frames[0].astype(float) - frames[1].astype(float)).mean(axis=(1, 2, 3))
    # Training and encoding are deterministic: one motion for both seeds would give the same
    # bytes, every frame's difference 0. Frame 0 (the shared rest pose) differs only by the
    # codec's noise, as the encoder sees different later frames; the seeds' motions part as
    # they train, so the last frame differs by more: by 11.7x on one machine, 9.9x on another
    # (the CPU's rounding steers the trainings), a ratio the motion sets, not the sweep.
    assert diff[0] > 0 and diff[-1] > diff[0], diff
    assert docs[0]["mean_displacement"] != docs[1]["mean_displacement"]
    assert not (results / "hop" / "train").exists()  # no unswept run beside the seeds


def test_the_selection_follows_the_configs_rule(swept):
    results = swept / "results"
    docs = {
        s: json.loads(results_layout.metrics_json(results, f"hop/seed_{s}").read_text())
        for s in (0, 1)
    }
    best = json.loads(results_layout.best_json(results, "hop").read_text())
    metric = best["rule"]["metric"]
    assert (best["rule"]["mode"], metric) == ("min", "penetration_excess")  # the config's default
    assert best["seed"] == min((docs[s][metric], s) for s in (0, 1))[1]
    assert best["folder"] == f"results/hop/seed_{best['seed']}"  # as the config's results
    table = (results_layout.sweep_tsv(results, "hop")).read_text().splitlines()
    assert len(table) == 3 and table[0].startswith("seed\trun\tchosen")
    tsv = (results / "metrics.tsv").read_text()
    assert "hop/seed_0\t" in tsv and "hop/seed_1\t" in tsv


def test_the_report_shows_both_seeds_side_by_side(swept, tmp_path):
    snakemake(swept, "--report", str(tmp_path / "report.html"))
    html = (tmp_path / "report.html").read_text()
    assert "seeds.png" in html
    for seed in (0, 1):
        assert f"hop/seed_{seed}" in html


def test_a_rule_change_reruns_only_the_sweep_and_a_new_seed_trains_only_itself(swept):
    rerun = planned_jobs(snakemake(swept, "-n", "--config", "sweep={mode: max}"))
    assert set(rerun) == {"sweep"}
    sweep_sheet(swept, "0 1 2")
    try:
        more = planned_jobs(snakemake(swept, "-n"))
    finally:
        sweep_sheet(swept, "0 1")
    assert {rule: more.get(rule, 0) for rule in PER_RUN} == dict.fromkeys(PER_RUN, 1)
    assert not set(more) & set(UPSTREAM)
    assert more["sweep"] == 1 and more["aggregate"] == 1


def test_each_seeds_training_reports_in_its_log_and_chord_status_tells_it_done(swept):
    """Through Snakemake (stderr no terminal): each seed's train_coarse log has progress lines
    of its run, attempt 1, in increasing iterations to the last (20: the early stop of 30);
    its live previews are beside its training; chord status reads the tree as both done."""
    results = swept / "results"
    for seed in (0, 1):
        run = f"hop/seed_{seed}"
        lines = [
            parsed[1]
            for line in results_layout.log(results, run, "train_coarse").read_text().splitlines()
            if (parsed := progress.parse_line(line)) and parsed[0] == progress.TAG
        ]
        its = [int(f["it"].split("/")[0]) for f in lines]
        assert its[0] == 1 and its[-1] == 20 and its == sorted(set(its)), its
        assert {(f["scene"], f["stage"], f["attempt"]) for f in lines} == {(run, "coarse", "1")}
        previews = results_layout.previews_dir(results, run)
        # preview_every -1: iterations // 10 = every 3, and after the last
        names = sorted(p.name for p in previews.glob("it_*.mp4"))
        assert names == [f"it_{i:06d}.mp4" for i in (3, 6, 9, 12, 15, 18, 20)]
        assert (previews / "latest.mp4").is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "chord.cli.main", "status", "--json"],
        capture_output=True, text=True, cwd=swept, env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )  # fmt: skip
    runs = {r["run"]: r for r in json.loads(proc.stdout)["runs"]}
    assert {k: (r["state"], r["done"]) for k, r in runs.items()} == {
        f"hop/seed_{s}": ("done", "evaluate") for s in (0, 1)
    }

"""The training's live previews in the report (issue 48): the default target draws each run's
strip from the previews its finished training wrote (declared inputs, listed once the
training checkpoint is done), a tree without the strip gets it without training again, and
`snakemake --report` puts it on the run's page."""

from __future__ import annotations

import shutil

import numpy as np
from PIL import Image

from chord.plan import results_layout
from chord.stages import preview_strip
from tests.workflow.test_scale import snakemake
from tests.workflow.test_workflow import planned_jobs


def test_a_finished_training_gets_its_preview_strip_and_the_report_shows_it(finished, tmp_path):
    work = tmp_path / "strip"
    shutil.copytree(finished[0], work, symlinks=True, copy_function=shutil.copy2)
    snakemake(work, "--until", "code")  # the copy's code jobs re-run once (absolute paths)
    assert planned_jobs(snakemake(work, "-n")) == {}
    results = work / "results"
    previews = sorted(results_layout.previews_dir(results, "hop").glob("it_*.mp4"))
    assert previews  # preview_every -1 on 2 iterations: every iteration
    strip = results_layout.preview_strip_png(results, "hop")
    img = np.asarray(Image.open(strip).convert("RGB"))
    rows = {np.asarray(Image.open(strip)).shape[0] // len(previews)}
    assert len(rows) == 1 and img.shape[0] % len(previews) == 0  # one row per preview
    # a results tree without the strip (as before this rule) gets it, and nothing else runs
    strip.unlink()
    assert planned_jobs(snakemake(work, "-n")) == {"preview_strip": 1}
    snakemake(work)
    np.testing.assert_array_equal(np.asarray(Image.open(strip).convert("RGB")), img)
    log = results_layout.log(results, "hop", "preview_strip").read_text()
    its = sorted(preview_strip.iteration(p) for p in previews)
    assert f"{len(its)} previews, iterations {its}" in log
    report = tmp_path / "report.html"
    snakemake(work, "--report", str(report))
    html = report.read_text()
    assert "previews.png" in html and "live previews of the training" in html

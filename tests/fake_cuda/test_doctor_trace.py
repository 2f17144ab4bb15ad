"""``chord doctor --trace`` (chord.checks.trace): each tier's iteration on a faked cuda:0 at the
config's shapes, its traced peak beside the model's and the tier's card, with no GPU. The
experts are built at the configured Wan folder's shapes (the tiny random folder here, so the
test takes seconds; with an A14B folder, or none, A14B's)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from chord.guidance import tiny_models
from tests.conftest import REPO
from tests.fake_cuda.test_fake_iteration import python


def test_the_trace_prints_each_tiers_peak_beside_the_model_and_refuses_a_card_too_small(tmp_path):
    python("-c", "")  # the compiler check (and its skip) of the faked runs
    wan = tiny_models.write_tiny_wan(tmp_path / "wan")
    taew = tiny_models.write_tiny_vae(tmp_path / "taew.safetensors", wan)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["guidance"].update(backend="wan", ckpt_dir=str(wan), tiny_vae_path=str(taew))
    split = config["tiers"]["split"]
    # the split tier's flags on a card of 0.001 GB: the trace must say it does not fit
    config["tiers"] = {"split": split, "thimble": {**split, "gpu_mem_gb": 0.001}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "chord.cli.main", "doctor", "--config", str(path), "--trace"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    # progress on stderr, one line per tier as it finishes (the demo's three scenes share one
    # method: traced once)
    assert "1 method(s) x 2 tier(s)" in proc.stderr
    assert proc.stderr.count("hop (+2): ") == 2, proc.stderr[-3000:]
    head, *rows = proc.stdout.strip().splitlines()
    assert head.split() == "scenes tier size traced peak model model/trace card fits".split()
    by_tier = {row.split()[2]: row for row in rows}
    assert set(by_tier) == {"split", "thimble"}
    # the demo's preset: 128x80, 21 frames, one video per step
    assert all("128*80x21 b1" in row for row in rows)
    assert "a 48 GB GPU" in by_tier["split"] and by_tier["split"].endswith("yes")
    assert "a 0.001 GB GPU" in by_tier["thimble"] and " no (" in by_tier["thimble"]
    peak = {t: float(r.split("GiB")[0].split()[-1]) for t, r in by_tier.items()}
    assert peak["split"] == peak["thimble"] > 0  # the same flags trace the same peak

"""The training stage on the demo scene `hop` with the oracle: hand-off file, loss log and
resume from the newest checkpoint of the same configuration."""

from __future__ import annotations

import csv
import functools
import json
import sys
from types import SimpleNamespace

import pytest
import torch

from chord.checks import report
from chord.config import result_keys as rk
from chord.config import settings
from chord.core import media
from chord.gaussians import ply
from chord.render import gsplat_backend
from chord.render.backend import BackendUnavailable
from chord.scene import demo, ingestion
from chord.stages import train as train_stage
from chord.stages.adapter import stage_logging
from chord.training import checkpoint, progress, scalars, scene_trainer
from chord.training.run_settings import RunSettings
from tests.components import TENSORBOARD, missing
from tests.stages.test_geometry_stages import TINY_TRAINING, train_inputs


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    data = demo.write_demo_scene("hop", root / "data", frame_num=5)
    m = settings.method_from_mapping({**TINY_TRAINING, "save_interval": 2})
    inputs = train_inputs(data, root / "results", "hop", m)
    return root, m, inputs


def test_coarse_stage_writes_the_hand_off_and_resumes(hop):
    root, m, inputs = hop
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    out, log, ckpts = root / "coarse.pt", root / "losses.tsv", root / "ckpt"
    summary = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=out,
        loss_log=log,
        checkpoint_dir=ckpts,
        method=m,
        guidance=guidance,
    )
    assert summary == {"stage": "coarse", "start": 1, "last": 4, "seed": 3}
    ckpt = checkpoint.load_checkpoint(out)
    assert ckpt["iteration"] == 4 and ckpt["seed"] == 3
    assert (ckpt["render_backend"], ckpt["device"]) == ("torch", "cpu")  # what rendered, where
    (folder,) = ckpts.iterdir()  # one folder per configuration hash
    assert folder.name == rk.training_hash(m, guidance)
    assert sorted(p.name for p in folder.iterdir()) == [
        "ckpt_000001.pt",
        "ckpt_000002.pt",
        "ckpt_000004.pt",
        "losses.tsv",  # the loss log across attempts, copied to the output
        "progress.json",  # the newest progress (chord status reads it)
        "progress.jsonl",  # every progress line and event across attempts
    ]
    with open(log) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [int(r["it"]) for r in rows] == [1, 2, 3, 4]
    # a rerun resumes after the newest checkpoint and runs nothing more
    again = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "again.pt",
        loss_log=log,
        checkpoint_dir=ckpts,
        method=m,
        guidance=guidance,
    )
    assert again["start"] == 5 and again["last"] == 4
    a, b = checkpoint.load_checkpoint(out), checkpoint.load_checkpoint(root / "again.pt")
    for k in a["motion"]:
        assert a["motion"][k].equal(b["motion"][k]), k
    # a changed configuration starts fresh
    m2 = settings.method_from_mapping({**vars(m), "iterations": 2})
    fresh = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "fresh.pt",
        loss_log=root / "l2.tsv",
        checkpoint_dir=ckpts,
        method=m2,
        guidance=guidance,
    )
    assert fresh["start"] == 1 and len(list(ckpts.iterdir())) == 2
    # a checkpoint cut short by a kill is skipped in favour of the one before it
    (folder / "ckpt_000004.pt").write_bytes(b"truncated")
    resumed = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "r.pt",
        loss_log=root / "l3.tsv",
        checkpoint_dir=ckpts,
        method=m,
        guidance=guidance,
    )
    assert resumed["start"] == 3
    # a new output (Snakemake deletes a failed attempt's) still holds every row: the rows
    # before the resume point come from the log beside the checkpoints
    with open(root / "l3.tsv") as f:
        assert [int(r["it"]) for r in csv.DictReader(f, delimiter="\t")] == [1, 2, 3, 4]
    r = checkpoint.load_checkpoint(root / "r.pt")
    for k in a["motion"]:  # and the resumed run ends bit for bit where the first one did
        assert r["motion"][k].equal(a["motion"][k]), k


def progress_lines(log):
    """The fields of each progress line of a log file."""
    out = []
    for line in log.read_text().splitlines():
        parsed = progress.parse_line(line)
        if parsed and parsed[0] == progress.TAG:
            out.append(parsed[1])
    return out


def test_progress_lines_reach_the_log_without_a_terminal_and_resume_from_the_checkpoint(
    hop, tmp_path
):
    root, m, inputs = hop
    assert not sys.stderr.isatty()  # as under Snakemake and Slurm: tqdm is off
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    kwargs = dict(
        inputs=inputs,
        checkpoint_dir=tmp_path / "ckpt",
        method=m,
        guidance=guidance,
        run_settings=RunSettings(
            scene="hop",
            tier="full",
            attempt=2,
            progress_every_s=0,  # every iteration
        ),
    )
    first = tmp_path / "first.log"
    with stage_logging(str(first)):
        train_stage.run_stage(
            "coarse", out=tmp_path / "a.pt", loss_log=tmp_path / "a.tsv", **kwargs
        )
    text = first.read_text()
    assert "\x1b" not in text and "\r" not in text  # no terminal codes, one line each
    lines = progress_lines(first)
    assert [f["it"] for f in lines] == ["1/4", "2/4", "3/4", "4/4"]
    for f in lines:
        assert list(f) == list(progress.FIELDS)
        assert (f["scene"], f["stage"], f["tier"], f["attempt"]) == ("hop", "coarse", "full", "2")
        assert float(f["s_per_it"]) > 0 and float(f["sds"]) >= 0
    assert [float(f["pct"]) for f in lines] == [25.0, 50.0, 75.0, 100.0]
    (folder,) = (tmp_path / "ckpt").iterdir()
    latest = json.loads((folder / progress.LATEST).read_text())
    assert (latest["state"], latest["it"], latest["total"]) == ("done", 4, 4)
    # a run killed after its checkpoint of iteration 2 resumes at 3: its iterations 3 and 4
    # are marked superseded, not counted twice, and the new process's lines start at 3
    (folder / "ckpt_000004.pt").write_bytes(b"truncated")
    (folder / "ckpt_000003.pt").unlink(missing_ok=True)
    second = tmp_path / "second.log"
    with stage_logging(str(second)):
        again = train_stage.run_stage(
            "coarse", out=tmp_path / "b.pt", loss_log=tmp_path / "b.tsv", **kwargs
        )
    assert again["start"] == 3
    assert [f["it"] for f in progress_lines(second)] == ["3/4", "4/4"]
    recs = [r for r in progress.read_records(folder / progress.JSONL) if "event" not in r]
    assert [r["it"] for r in recs] == [1, 2, 3, 4]
    lines = (folder / progress.JSONL).read_text().splitlines()
    assert sum('"superseded": "resume"' in line for line in lines) == 2


def test_live_previews_show_the_motion_and_change_nothing(hop, tmp_path):
    root, m, inputs = hop
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    folder = tmp_path / "previews"
    preview = {"folder": folder, "every": 3, "ref_azim": 0.0, "ref_cam_radius": 2.0, "fps": 10}
    states = {}
    for name, kw in (("plain", {}), ("previewed", {"run_settings": RunSettings(preview=preview)})):
        train_stage.run_stage(
            "coarse",
            inputs=inputs,
            out=tmp_path / f"{name}.pt",
            loss_log=tmp_path / f"{name}.tsv",
            checkpoint_dir=tmp_path / f"ckpt_{name}",
            method=m,
            guidance=guidance,
            **kw,
        )
        states[name] = checkpoint.load_checkpoint(tmp_path / f"{name}.pt")
    for k, v in states["plain"]["motion"].items():  # the previews draw nothing, change nothing
        assert v.equal(states["previewed"]["motion"][k]), k
    # every 3 iterations and after the last (4): the run's frames at the SDS size (48 x 32:
    # narrower than the previews' 256 px), the newest also as latest.mp4
    assert sorted(p.name for p in folder.iterdir()) == ["it_000003.mp4", "it_000004.mp4",
                                                          "latest.mp4"]  # fmt: skip
    frames, _ = media.read_mp4(folder / "latest.mp4")
    assert frames.shape == (m.frame_num, 32, 48, 3)
    assert (folder / "latest.mp4").read_bytes() == (folder / "it_000004.mp4").read_bytes()
    first, _ = media.read_mp4(folder / "it_000003.mp4")
    assert first.std() > 0  # the scene, not an empty background
    (ckpt,) = (tmp_path / "ckpt_previewed").iterdir()
    latest = json.loads((ckpt / progress.LATEST).read_text())
    assert latest["preview"] == str(folder / "it_000004.mp4") and latest["preview_s"] > 0


def test_tensorboard_scalars_follow_the_iterations_across_a_resume(hop, tmp_path):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as exc:
        missing(TENSORBOARD, f"tensorboard does not import ({exc})")
    root, m, inputs = hop
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    kw = dict(inputs=inputs, checkpoint_dir=tmp_path / "ckpt", method=m, guidance=guidance,
              run_settings=RunSettings(tensorboard=True))  # fmt: skip
    train_stage.run_stage("coarse", out=tmp_path / "a.pt", loss_log=tmp_path / "a.tsv", **kw)
    (folder,) = (tmp_path / "ckpt").iterdir()
    (folder / "ckpt_000004.pt").write_bytes(b"truncated")  # killed after iteration 2's
    again = train_stage.run_stage(
        "coarse", out=tmp_path / "b.pt", loss_log=tmp_path / "b.tsv", **kw
    )
    assert again["start"] == 3
    board = EventAccumulator(str(folder / scalars.FOLDER))
    board.Reload()
    with open(tmp_path / "b.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    events = board.Scalars("coarse/sds")
    assert [e.step for e in events] == [1, 2, 3, 4]  # iterations 3 and 4 once, the resumed
    for e, row in zip(events, rows, strict=True):
        assert e.value == pytest.approx(float(row["sds"]), rel=1e-5)  # the TSV's 6 digits
    assert "coarse/seconds_per_iteration" in board.Tags()["scalars"]


def test_tensorboard_without_the_package_stops_with_the_extra_to_install(hop, monkeypatch):
    root, m, inputs = hop
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # an import fails
    with pytest.raises(settings.ConfigError, match=r"pip install -e '.\[tensorboard\]'"):
        train_stage.run_stage(
            "coarse", inputs=inputs, out=root / "x.pt", loss_log=root / "x.tsv",
            checkpoint_dir=root / "none", method=m,
            guidance=settings.guidance_from_mapping({"backend": "oracle"}),
            run_settings=RunSettings(tensorboard=True),
        )  # fmt: skip
    assert not (root / "none").exists()  # stopped before anything


def test_oracle_needs_the_scripted_motion(hop, tmp_path):
    root, m, inputs = hop
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    with pytest.raises(ValueError, match="motion.json: missing; the oracle guidance"):
        scene_trainer.build(**{**inputs, "data_dir": tmp_path}, method=m, guidance=guidance)


def test_build_reads_the_contact_terms_at_the_evaluations_own_samples(hop):
    """Issue 36: with a contact weight the trainer gets the static objects' distance grid and,
    per dynamic object, exactly the surface samples the evaluate stage measures; off, neither
    (no grid is built)."""
    import numpy as np

    from chord.evaluation import interaction, metrics

    root, m, inputs = hop
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    on = settings.method_from_mapping({**vars(m), "lambda_contact": 1.0e9, "lambda_support": 0.0})
    tr = scene_trainer.build(**inputs, method=on, guidance=guidance)
    doc = ingestion.read_scene_json(inputs["scene_json"])
    mesh = ingestion.object_mesh(inputs["scene_json"], doc, "obj_0")
    S = metrics.surface_samples(*mesh, interaction.INTERACTION_SAMPLES, seed=0)
    assert list(tr.contact_points) == ["obj_0"]
    assert np.array_equal(tr.contact_points["obj_0"].double().numpy(), S.astype(np.float32))
    slab_top = max(v[1] for v in ingestion.object_mesh(inputs["scene_json"], doc, "obj_1")[0])
    assert float(tr.contact_grid(torch.tensor([[0.0, slab_top + 0.05, 0.0]]))) > 0
    assert float(tr.contact_grid(torch.tensor([[0.0, slab_top - 0.01, 0.0]]))) < 0
    off = settings.method_from_mapping({**vars(m), "lambda_contact": 0.0, "lambda_support": 0.0})
    tr = scene_trainer.build(**inputs, method=off, guidance=guidance)
    assert tr.contact_grid is None and tr.contact_points == {}


def test_log_run_time_adds_phase_timings_to_the_loss_log(hop):
    root, m, inputs = hop
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    timed = settings.method_from_mapping({**vars(m), "iterations": 2})
    train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "timed.pt",
        loss_log=root / "timed.tsv",
        checkpoint_dir=root / "timed_ckpt",
        method=timed,
        memory=settings.memory_from_mapping({"log_run_time": True}),
        guidance=guidance,
    )
    with open(root / "timed.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 2
    assert all(float(r["sds_s"]) > 0 and float(r["regularisers_s"]) > 0 for r in rows)


NO_TOOLKIT = "found no CUDA toolkit (nvcc under CUDA_HOME or on PATH)"


@pytest.fixture
def cuda_without_gsplat_kernels(monkeypatch):
    """CUDA "available" (one 80 GiB card of capability 8.6), gsplat installed but its kernels
    absent (its extension is None without nvcc), probed afresh: a GPU node without a CUDA
    toolkit. Every read of an input file is recorded: nothing may be."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    card = SimpleNamespace(name="Fake GPU", total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: card)
    monkeypatch.setattr(gsplat_backend, "device_capability", lambda device=None: (8, 6))
    monkeypatch.setattr(gsplat_backend, "load_kernels", lambda capability, **kw: None)
    # the probe is cached per process: a fresh one sees this machine, and none leaks out
    probe = functools.cache(gsplat_backend.unavailable_reason.__wrapped__)
    monkeypatch.setattr(gsplat_backend, "unavailable_reason", probe)
    reads = []

    def recorded(what):
        def read(path, *args, **kw):
            reads.append((what, path))
            raise AssertionError(f"{what} of {path} before the render backend was resolved")

        return read

    monkeypatch.setattr(ply, "read_ply", recorded("read_ply"))
    monkeypatch.setattr(ingestion, "read_scene_json", recorded("read_scene_json"))
    return reads


def test_build_resolves_the_render_backend_before_reading_anything(
    cuda_without_gsplat_kernels, tmp_path
):
    """On CUDA without gsplat's kernels, "auto" fails with the reason and the fix before the
    trainer reads scene.json, a PLY or a voxel file: none of them exists here."""
    missing = tmp_path / "missing"
    with pytest.raises(BackendUnavailable) as err:
        scene_trainer.build(
            scene_json=missing / "scene.json",
            plys={"obj_0": missing / "obj_0.ply", "obj_1": missing / "obj_1.ply"},
            voxels={"obj_0": missing / "obj_0.npz"},
            text_path=None,
            data_dir=missing,
            method=settings.method_from_mapping({}),
            guidance=settings.guidance_from_mapping({"backend": "oracle"}),
            device="cuda",
            render_backend="auto",
        )
    msg = str(err.value)
    assert msg.startswith("render_backend: auto: gsplat ") and NO_TOOLKIT in msg
    assert "render_backend: torch" in msg  # the fix
    assert cuda_without_gsplat_kernels == [] and not missing.exists()


def test_training_stage_stops_on_the_render_backend_before_loading_a_ply(
    cuda_without_gsplat_kernels, tmp_path
):
    """The stage's preflight (which reads only the PLY headers' vertex counts) names the
    missing kernels and stops the training before the trainer loads any Gaussians."""
    plys = {}
    for name in ("obj_0", "obj_1"):  # headers only: no Gaussians a loader could read
        plys[name] = tmp_path / f"{name}.ply"
        plys[name].write_bytes(
            b"ply\nformat binary_little_endian 1.0\nelement vertex 300\nend_header\n"
        )
    missing = tmp_path / "missing"
    inputs = {
        "scene_json": missing / "scene.json",
        "plys": plys,
        "voxels": {"obj_0": missing / "obj_0.npz"},
        "text_path": None,
        "data_dir": missing,
    }
    with pytest.raises(report.PreflightError) as err:
        train_stage.run_stage(
            "coarse",
            inputs=inputs,
            out=tmp_path / "coarse.pt",
            loss_log=tmp_path / "losses.tsv",
            checkpoint_dir=tmp_path / "ckpt",
            method=settings.method_from_mapping({}),
            guidance=settings.guidance_from_mapping({"backend": "oracle"}),
            device="cuda",
            render_backend="auto",
            env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        )
    msg = str(err.value)
    assert "gsplat: render_backend: auto: gsplat " in msg and NO_TOOLKIT in msg
    assert "render_backend: torch" in msg
    assert cuda_without_gsplat_kernels == [] and not (tmp_path / "ckpt").exists()

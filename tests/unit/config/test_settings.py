import dataclasses

import pytest
import yaml

from chord.config import result_keys as rk
from chord.config import settings
from tests.conftest import REPO, write_config

# Where the shipped config departs from the release's flag defaults (the schema's, which
# `chord train` keeps): every documented CHORD command passes --use_tiny_vae (without it the full
# Wan VAE backpropagates and no GPU fits 832x480), --resample_timestep and --early_stop.
SHIPPED = {"use_tiny_vae": True, "resample_timestep": True, "early_stop": True}


def test_default_config_holds_every_method_default():
    """config/config.yaml lists every schema key under method: with the schema's default,
    except the documented departures (SHIPPED)."""
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    props = settings.method_schema()["properties"]
    assert set(conf["method"]) == set(props)
    for key, value in conf["method"].items():
        default = SHIPPED.get(key, props[key]["default"])
        assert value == default, key
        assert type(value) is type(default), key
    flags = settings.memory_schema()["properties"]  # and the memory section its flags' defaults
    assert conf["memory"] == {k: spec["default"] for k, spec in flags.items()}
    assert not set(flags) & set(props)  # a memory flag is never a method key


def test_chord_train_keeps_the_release_flag_defaults_and_the_workflow_runs_the_recipe():
    """METHOD §10, §12, §19: the CLI without flags is the release's train.py (all three off);
    the workflow's method defaults are the documented command's (all three on)."""
    from chord.cli import upstream_train

    _, cli, _ = upstream_train.parse(
        ["--mesh_source_path", "data/x", "-m", "out/x", "--prompt", "p"]
    )
    assert (cli.use_tiny_vae, cli.resample_timestep, cli.early_stop) == (False, False, False)
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    workflow = settings.method_from_mapping(conf["method"])
    assert (workflow.use_tiny_vae, workflow.resample_timestep, workflow.early_stop) == (
        True,
        True,
        True,
    )


def test_method_defaults_match_method_md():
    m = settings.method_from_mapping({})
    assert (m.init_voxel_size, m.cp_num, m.frame_num, m.size) == (0.015, 60, 41, "832*480")
    assert (m.batch_size, m.static_id, m.n_cp_num) == (4, 1, 3)
    mem = settings.memory_from_mapping({})  # METHOD §15: all memory modes off by default
    assert (mem.split_sds_backward, mem.split_render_chunk_size, mem.mmgp_profile) == (
        False,
        -1,
        4.0,
    )
    assert m.arap_landmarks == [1200, 800, 400, 200, 50]
    assert m.deform_lr_final == pytest.approx(6e-5)
    assert m.surface_target_num == 8000 and m.spatial_lr_scale == 2.2


def test_default_workflow_config_loads():
    conf = settings.load(yaml.safe_load((REPO / "config/config.yaml").read_text()), base=REPO)
    assert set(conf.scenes) == {"hop", "sway", "slide"}
    hop = conf.scenes["hop"].method
    assert hop.gs_init_num == 1500 and hop.frame_num == 21  # the demo's scene overrides
    assert conf.scenes["sway"].method == conf.scenes["slide"].method == hop  # one preset
    assert conf.scenes["hop"].n_prompt == "."
    assert conf.guidance.backend == "oracle"
    assert list(conf.tiers)[:3] == ["full", "split", "offload"]


def test_scene_overrides_apply_per_scene(tmp_path):
    path = write_config(
        tmp_path,
        [
            {"scene": "a", "data": "d/a", "prompt": "p"},
            {"scene": "b", "data": "d/b", "prompt": "q"},
        ],
        scene_overrides={"a": {"cp_num": 40}},
    )
    conf = settings.load_file(path)
    assert conf.scenes["a"].method.cp_num == 40
    assert conf.scenes["b"].method.cp_num == 60


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"method": {"cp_nmu": 3}}, "Additional properties are not allowed ('cp_nmu'"),
        ({"method": {"cp_num": "many"}}, "method.cp_num: 'many' is not of type 'integer'"),
        ({"method": {"frame_num": 40}}, "frame_num: 40 is not 4k+1"),
        ({"method": {"size": "833*480"}}, "nearest valid sizes: 832*480, 848*480"),
        ({"colour": 1}, "Additional properties are not allowed ('colour'"),
        ({"scene_overrides": {"zz": {"cp_num": 4}}}, "scene_overrides: unknown scene(s) zz;"),
        ({"scene_overrides": {"a": {"cp_num": 1.5}}}, "scene_overrides.a: cp_num: 1.5"),
        ({"method": {"azim_segments": [0, 90, 180]}}, "azim_segments: needs [start end] pairs"),
    ],
)
def test_bad_config_values_name_the_key(tmp_path, extra, message):
    path = write_config(tmp_path, [{"scene": "a", "data": "d/a", "prompt": "p"}], **extra)
    with pytest.raises(settings.ConfigError) as err:
        settings.load_file(path)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"scene": "a", "data": "x", "prompt": "p"}] * 2, "scene 'a' duplicates line 2"),
        ([{"scene": "../x", "data": "x", "prompt": "p"}], "does not match '^[A-Za-z0-9_-]+$'"),
        ([{"scene": "a b", "data": "x", "prompt": "p"}], "line 2: scene: 'a b' does not match"),
        ([{"scene": "a", "data": "x", "prompt": ""}], "line 2: scene 'a': prompt is missing"),
        ([{"scene": "a", "data": "x", "prompt": "p", "tier": "huge"}], "tier 'huge' is not one of"),
    ],
)
def test_bad_sheet_rows_name_line_and_field(tmp_path, rows, message):
    path = write_config(tmp_path, rows)
    with pytest.raises(settings.ConfigError) as err:
        settings.load_file(path)
    assert message in str(err.value)
    assert "scenes.tsv" in str(err.value)


def test_unknown_sheet_column_is_an_error(tmp_path):
    path = write_config(tmp_path, [{"scene": "a", "data": "x", "prompt": "p"}])
    sheet = tmp_path / "scenes.tsv"
    sheet.write_text(sheet.read_text().replace("tier", "teir"))
    with pytest.raises(settings.ConfigError, match="'teir' was unexpected"):
        settings.load_file(path)


def test_object_roles():
    m = settings.method_from_mapping({"avoid_objs": ["obj_3"], "additional_static_objs": ["obj_2"]})
    assert settings.object_roles(m, 4) == {
        "obj_0": "dynamic",
        "obj_1": "static",
        "obj_2": "static",
        "obj_3": "avoided",
    }
    with pytest.raises(settings.ConfigError, match=r"static_id: 1 is outside \[0, 1\)"):
        settings.object_roles(m, 1)
    with pytest.raises(settings.ConfigError, match="avoid_objs: obj_3 does not exist"):
        settings.object_roles(settings.method_from_mapping({"avoid_objs": ["obj_3"]}), 2)
    with pytest.raises(settings.ConfigError, match="add_cp_objs: obj_1 is static"):
        settings.object_roles(settings.method_from_mapping({"add_cp_objs": ["obj_1"]}), 2)


def test_parse_size():
    assert settings.parse_size("832*480") == (832, 480)
    assert settings.parse_size("576x320") == (576, 320)
    with pytest.raises(settings.ConfigError):
        settings.parse_size("832*464x")


def test_the_wan_teacher_needs_its_folder_and_the_tiny_vae_file_it_uses(tmp_path):
    """Checked when the config loads, before any job: the keys are named."""
    from tests.conftest import write_config

    def load(guidance, **method):
        path = write_config(
            tmp_path / str(len(list(tmp_path.iterdir()))),
            [{"scene": "s", "data": "d", "prompt": "p"}],
            guidance=guidance,
            method=method,
        )
        return settings.load_file(path)

    with pytest.raises(settings.ConfigError, match=r"guidance.ckpt_dir: the wan teacher needs"):
        load({"backend": "wan"})
    with pytest.raises(
        settings.ConfigError, match=r"guidance.tiny_vae_path: not set, but method.use"
    ):
        load({"backend": "wan", "ckpt_dir": "/models/wan"}, use_tiny_vae=True)
    assert load({"backend": "wan", "ckpt_dir": "/w", "tiny_vae_path": "/t.pth"}, use_tiny_vae=True)
    assert load({"backend": "wan", "ckpt_dir": "/models/wan"})  # the full Wan VAE: allowed
    assert load({"backend": "oracle"}, use_tiny_vae=True)  # the oracle uses no VAE
    g = settings.guidance_from_mapping({"backend": "wan", "ckpt_dir": "/w"})
    with pytest.raises(settings.ConfigError, match=r"--tiny_vae_path: not set, but --use_tiny_vae"):
        settings.check_guidance(
            g, {"chord train": settings.method_from_mapping({"use_tiny_vae": True})}, flags=True
        )


def test_presets_travel_with_the_sheet_rows(tmp_path):
    """A row's preset names method values over `method`; scene_overrides go over it; an
    unknown preset is an error naming it; long lists of names are cut."""
    from tests.conftest import write_config

    rows = [
        {"scene": "mine", "data": "d", "prompt": "p"},
        {"scene": "demo", "data": "d", "prompt": "p", "preset": "small"},
        {"scene": "tuned", "data": "d", "prompt": "p", "preset": "small"},
    ]
    presets = {"small": {"size": "128*80", "iterations": 300}}
    path = write_config(
        tmp_path / "a", rows, presets=presets, scene_overrides={"tuned": {"iterations": 20}}
    )
    conf = settings.load_file(path)
    assert conf.scenes["mine"].method.size == "832*480"  # the method, untouched
    assert (conf.scenes["demo"].method.size, conf.scenes["demo"].method.iterations) == (
        "128*80",
        300,
    )
    assert (conf.scenes["tuned"].method.size, conf.scenes["tuned"].method.iterations) == (
        "128*80",
        20,
    )
    bad = write_config(tmp_path / "b", [{**rows[1], "preset": "tiny"}], presets=presets)
    with pytest.raises(
        settings.ConfigError, match=r"line 2: scene 'demo': preset 'tiny' is not one"
    ):
        settings.load_file(bad)
    wrong = write_config(tmp_path / "c", rows[1:2], presets={"small": {"sise": "1*1"}})
    with pytest.raises(settings.ConfigError, match=r"presets.small: .*'sise' was unexpected"):
        settings.load_file(wrong)
    many = [{"scene": f"s{i}", "data": "d", "prompt": "p"} for i in range(1000)]
    over = write_config(tmp_path / "d", many, scene_overrides={"hop": {}, "sway": {}})
    with pytest.raises(settings.ConfigError) as err:
        settings.load_file(over)
    msg = str(err.value)
    assert "unknown scene(s) hop, sway" in msg and "s0, s1, s2, s3, s4 (+995 more)" in msg
    assert len(msg) < 300


@pytest.mark.parametrize("key", ["static_threshold", "penetration_threshold"])
def test_evaluation_thresholds_change_evaluate_but_not_the_training_hash(key):
    """The warning thresholds are read by evaluate alone: a new value reruns it (its params)
    but never the training."""
    method = settings.method_from_mapping({})
    other = dataclasses.replace(method, **{key: getattr(method, key) * 3})
    guidance = settings.guidance_from_mapping({})
    assert rk.training_hash(other, guidance) == rk.training_hash(method, guidance)
    assert rk.stage_params(other, "evaluate") != rk.stage_params(method, "evaluate")
    assert key in rk.VIEW_KEYS and key in rk.STAGE_KEYS["evaluate"]

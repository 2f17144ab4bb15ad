import numpy as np
from PIL import Image

from chord.config import settings
from chord.core import media
from chord.plan import results_layout
from chord.stages import reference
from tests.stages.test_geometry_stages import run_all


def test_reference_stage_renders_the_scene(toy_scene, tmp_path):
    method = settings.method_from_mapping(
        {"gs_init_num": 4000, "size": "160*96", "surface_target_num": 500}
    )
    results = tmp_path / "r"
    run_all(toy_scene, results, "toy", method)
    plys = {o: results_layout.gaussians_ply(results, "toy", o) for o in ("obj_0", "obj_1")}
    reference.run(
        scene_json=results_layout.scene_json(results, "toy"),
        plys=plys,
        out_png=tmp_path / "ref.png",
        out_orbit=tmp_path / "orbit.mp4",
        method=method,
    )
    png = np.asarray(Image.open(tmp_path / "ref.png"))
    assert png.shape == (96, 160, 3)
    assert (png.min(-1) < 250).mean() > 0.05  # the scene covers part of the frame
    assert png[0, 0].tolist() == [255, 255, 255]  # white background
    # the orange-red block (obj_0) is at the centre of the reference view
    centre = png[40:60, 70:90].reshape(-1, 3).astype(int)
    assert (centre[:, 0] - centre[:, 2]).mean() > 60
    frames, meta = media.read_mp4(tmp_path / "orbit.mp4")
    assert frames.shape == (50, 96, 160, 3) and meta["fps"] == 20 and meta["codec"] == "h264"

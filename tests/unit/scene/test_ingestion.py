import numpy as np
import pytest
import trimesh

from chord.scene import ingestion
from tests.conftest import box, empty_glb, write_scene


def test_normalisation_of_a_known_box(tmp_path):
    """A 2 x 1 x 0.5 box and a unit cube centred at (3, 4, 5): longest side 1.2, centred at 0."""
    folder = write_scene(
        tmp_path / "s", [box([2.0, 1.0, 0.5], [3, 4, 5]), box([1, 1, 1], [3, 4, 5])]
    )
    parts = ingestion.load_parts(folder / "scene.glb")
    centre, scale = ingestion.normalisation(ingestion.bounds_of(parts))
    np.testing.assert_allclose(centre, [3, 4, 5])
    assert scale == pytest.approx(0.6)
    bounds = ingestion.bounds_of(ingestion.normalise_parts(parts, centre, scale))
    np.testing.assert_allclose(bounds, [[-0.6, -0.3, -0.3], [0.6, 0.3, 0.3]], atol=1e-6)
    obj = ingestion.normalise_parts(ingestion.load_parts(folder / "obj_1.glb"), centre, scale)
    assert ingestion.object_scale_factor(ingestion.bounds_of(obj)) == pytest.approx(0.5)


def test_node_transforms_are_applied(tmp_path):
    mesh = trimesh.creation.box(extents=[1, 1, 1])
    scene = trimesh.Scene()
    matrix = trimesh.transformations.translation_matrix([10, 0, 0]) @ np.diag([2, 2, 2, 1])
    scene.add_geometry(mesh, transform=matrix)
    path = tmp_path / "t.glb"
    scene.export(path, file_type="glb")
    np.testing.assert_allclose(
        ingestion.bounds_of(ingestion.load_parts(path)), [[9, -1, -1], [11, 1, 1]]
    )


def test_discover_objects(tmp_path):
    folder = write_scene(tmp_path / "s", [box([1, 1, 1], [0, 0, 0])] * 3)
    assert [p.name for p in ingestion.discover_objects(folder)] == [
        "obj_0.glb",
        "obj_1.glb",
        "obj_2.glb",
    ]
    with pytest.raises(ingestion.SceneError, match="obj_num is 2 but the folder holds 3 objects"):
        ingestion.discover_objects(folder, obj_num=2)
    (folder / "obj_1.glb").unlink()
    with pytest.raises(
        ingestion.SceneError, match=r"obj_1\.glb: missing; object ids must be contiguous"
    ):
        ingestion.discover_objects(folder)
    (folder / "scene.glb").unlink()
    with pytest.raises(ingestion.SceneError, match=r"scene\.glb: missing"):
        ingestion.discover_objects(folder)
    with pytest.raises(ingestion.SceneError, match="scene folder not found"):
        ingestion.discover_objects(tmp_path / "nowhere")


def test_load_parts_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.glb"
    bad.write_text("solid ascii stl, not a glb")
    with pytest.raises(ingestion.SceneError, match=r"bad\.glb: not a GLB file"):
        ingestion.load_parts(bad)
    empty = tmp_path / "empty.glb"
    empty.write_bytes(empty_glb())
    with pytest.raises(ingestion.SceneError, match=r"empty\.glb: holds no triangles"):
        ingestion.load_parts(empty)

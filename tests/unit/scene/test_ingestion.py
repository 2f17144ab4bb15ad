import numpy as np
import pytest
import trimesh

from chord.scene import ingestion as sc
from tests.conftest import box, empty_glb, write_scene


def test_normalisation_of_a_known_box(tmp_path):
    """A 2 x 1 x 0.5 box and a unit cube centred at (3, 4, 5): longest side 1.2, centred at 0."""
    folder = write_scene(
        tmp_path / "s", [box([2.0, 1.0, 0.5], [3, 4, 5]), box([1, 1, 1], [3, 4, 5])]
    )
    parts = sc.load_parts(folder / "scene.glb")
    centre, scale = sc.normalisation(sc.bounds_of(parts))
    np.testing.assert_allclose(centre, [3, 4, 5])
    assert scale == pytest.approx(0.6)
    bounds = sc.bounds_of(sc.normalise_parts(parts, centre, scale))
    np.testing.assert_allclose(bounds, [[-0.6, -0.3, -0.3], [0.6, 0.3, 0.3]], atol=1e-6)
    obj = sc.normalise_parts(sc.load_parts(folder / "obj_1.glb"), centre, scale)
    assert sc.object_scale_factor(sc.bounds_of(obj)) == pytest.approx(0.5)


def test_node_transforms_are_applied(tmp_path):
    mesh = trimesh.creation.box(extents=[1, 1, 1])
    scene = trimesh.Scene()
    matrix = trimesh.transformations.translation_matrix([10, 0, 0]) @ np.diag([2, 2, 2, 1])
    scene.add_geometry(mesh, transform=matrix)
    path = tmp_path / "t.glb"
    scene.export(path, file_type="glb")
    np.testing.assert_allclose(sc.bounds_of(sc.load_parts(path)), [[9, -1, -1], [11, 1, 1]])


def test_discover_objects(tmp_path):
    folder = write_scene(tmp_path / "s", [box([1, 1, 1], [0, 0, 0])] * 3)
    assert [p.name for p in sc.discover_objects(folder)] == ["obj_0.glb", "obj_1.glb", "obj_2.glb"]
    with pytest.raises(sc.SceneError, match="obj_num is 2 but the folder holds 3 objects"):
        sc.discover_objects(folder, obj_num=2)
    (folder / "obj_1.glb").unlink()
    with pytest.raises(sc.SceneError, match=r"obj_1\.glb: missing; object ids must be contiguous"):
        sc.discover_objects(folder)
    (folder / "scene.glb").unlink()
    with pytest.raises(sc.SceneError, match=r"scene\.glb: missing"):
        sc.discover_objects(folder)
    with pytest.raises(sc.SceneError, match="scene folder not found"):
        sc.discover_objects(tmp_path / "nowhere")


def test_load_parts_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.glb"
    bad.write_text("solid ascii stl, not a glb")
    with pytest.raises(sc.SceneError, match=r"bad\.glb: not a GLB file"):
        sc.load_parts(bad)
    empty = tmp_path / "empty.glb"
    empty.write_bytes(empty_glb())
    with pytest.raises(sc.SceneError, match=r"empty\.glb: holds no triangles"):
        sc.load_parts(empty)

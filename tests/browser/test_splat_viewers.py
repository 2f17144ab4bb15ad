"""Our splat files in two third-party viewers (issue 40): three.js's own
``GLTFGaussianSplatLoaderExtension`` (three 0.187, WebGPURenderer on WebGL 2) and Babylon.js's
``KHR_gaussian_splatting`` glTF extension (@babylonjs/core and /loaders 9.28), each loading
``dynamic_splats.glb`` (skinned, morphed) and ``dynamic_splats_rigid.glb`` (node animation)
in headless Chromium as a user of that library would (tests/tools/pages, bundled here by
esbuild from tests/tools' pinned packages: ``cd tests/tools && npm ci``).

Per viewer and file: it parses without an error, draws every splat (the count it reports),
frame 0 is not blank, and whether it animates (two times give different pixels), with the
moving object's direction on screen. What the viewers do, recorded here and in the README
("Which file plays where"): both play the rigid file's motion; neither plays the skins or
the morph targets of ``dynamic_splats.glb`` (neither reads JOINTS_0/WEIGHTS_0 or morph
targets on splats), which both draw at rest, unmoving: the same picture as the rigid file's
frame 0.

The scene: three boxes' surface Gaussians (as tests/browser/test_viewer.py's splat page):
obj_0 (orange) moved by a scripted rigid motion, right and up, turning by half a radian; obj_1 a
static grey slab; obj_2 (blue) with a second control-point layer (morphed in the skinned
file)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from chord.config import settings
from chord.export import rigid_motion, trained_scene
from chord.motion.model import build_scene
from chord.stages import viewer
from tests import components
from tests.browser.test_viewer import (  # noqa: F401 (chromium_installed: a fixture)
    BACKGROUND,
    CENTRE,
    FOVY,
    ORBIT,
    SCALE,
    chromium_installed,
    needs_chromium,
    toy_doc,
    toy_gaussians,
    toy_voxels,
    visit,
)
from tests.conftest import REPO
from tests.unit.export.test_trajectories import script_rigid

TOOLS = REPO / "tests" / "tools"
PAGES = {
    "three": TOOLS / "pages" / "three_splats.js",
    "babylon": TOOLS / "pages" / "babylon_splats.js",
}
PACKAGES = ("three", "@babylonjs/core", "@babylonjs/loaders", "esbuild")
FRAMES, FPS = 9, 8.0  # keys at k/8 s; the clip lasts 1 s
T_EARLY, T_LATE = 0.0, 1.0  # frame 0 and the last frame (LINEAR keys: exact at a key)
MOVE = np.array([0.5, 0.2, 0.0])  # obj_0's move over the clip, world units
TURN = 0.5  # obj_0's turn about y over the clip, radians
FILES = ("skinned", "rigid")
VIEWERS = ("three", "babylon")
READY = "splat-viewer: ready "
# Console lines that are no fault of the file: SwiftShader's read-back note.
NOISE = ("GPU stall due to ReadPixels",)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """The two pages' scripts bundled by esbuild from tests/tools' pinned packages."""
    if shutil.which("node") is None:
        components.missing(components.NODE, "esbuild bundles the viewers' pages on it")
    absent = [p for p in PACKAGES if not (TOOLS / "node_modules" / p / "package.json").is_file()]
    if absent:
        components.missing(components.NPM_TOOLS, f"{', '.join(absent)} not installed")
    out = tmp_path_factory.mktemp("bundles")
    esbuild = TOOLS / "node_modules" / ".bin" / "esbuild"
    scripts = {}
    for name, source in PAGES.items():
        target = out / f"{name}.js"
        cmd = [str(esbuild), str(source), "--bundle", "--minify", "--format=iife",
               "--target=es2020", "--log-level=error", f"--outfile={target}"]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        scripts[name] = target.read_text(encoding="utf-8")
    return scripts


@pytest.fixture(scope="module")
def splat_files(tmp_path_factory) -> dict:
    """dynamic_splats.glb and dynamic_splats_rigid.glb of the scene above, written by the
    export's writers."""
    root = tmp_path_factory.mktemp("splat_files")
    sets, doc = toy_gaussians(), toy_doc()
    rng = np.random.default_rng(2)
    vox = toy_voxels(sets, rng)
    method = settings.method_from_mapping({"frame_num": FRAMES, "n_cp_num": 3})
    scene = build_scene(doc, sets, vox, method)
    # obj_0: a turn by TURN about y through its centre and a move by MOVE, in even steps
    f = np.linspace(0.0, 1.0, FRAMES)[:, None]
    R = Rotation.from_rotvec(f * [0.0, TURN, 0.0]).as_matrix()
    mid = sets["obj_0"].means.mean(0)
    script_rigid(scene.dynamic["obj_0"], R, mid + f * MOVE * SCALE - R @ mid)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        obj2 = scene.dynamic["obj_2"]
        obj2.layer1.cp_deform.normal_(0, 0.03, generator=gen)
        means2 = torch.as_tensor(sets["obj_2"].means)
        obj2.add_second_layer(means2[::25].clone(), means2[::2].clone())
        obj2.layer2.cp_deform.normal_(0, 0.01, generator=gen)
    kw = {"doc": doc, "scene": scene, "gaussians": sets, "frames": FRAMES, "fps": FPS}
    out = {"skinned": root / "dynamic_splats.glb", "rigid": root / "dynamic_splats_rigid.glb"}
    summary = trained_scene.write_splats_glb(out["skinned"], **kw)
    assert (summary["skinned"], summary["morphed"]) == (1, 1)
    rigid = rigid_motion.write_rigid_splats_glb(out["rigid"], **kw)
    assert rigid["animated"] == 2 and rigid["residual_relative"]["obj_0"] < 1e-4
    return out


def query(t: float) -> str:
    return f"?t={t}&camera={','.join(map(str, ORBIT))}&fovy={FOVY}"


@pytest.fixture(scope="module")
def shots(bundles, splat_files, tmp_path_factory) -> dict:
    """{(viewer, file): {"early", "late": visit}}: each page at frame 0 and the last frame."""
    folder = tmp_path_factory.mktemp("chromium_viewers")
    out = {}
    for name in VIEWERS:
        for kind in FILES:
            page = folder / f"{name}_{kind}.html"
            text = viewer.page(
                splat_files[kind].read_bytes(), title=kind, script=bundles[name], view="splats"
            )
            page.write_text(text, encoding="utf-8")
            out[name, kind] = {
                when: visit(page.as_uri() + query(t), folder, f"{name}_{kind}_{when}")
                for when, t in (("early", T_EARLY), ("late", T_LATE))
            }
    return out


def ready_line(seen: dict) -> dict:
    """The page's ready line as {key: value}, after checking it is the only message."""
    messages = [m for m in seen["console"] if not any(n in m for n in NOISE)]
    assert len(messages) == 1 and messages[0].startswith(READY), messages
    return dict(re.findall(r"(\w+)=(\S+)", messages[0]))


def drawn(pixels: np.ndarray) -> np.ndarray:
    """[H, W] where the shot differs from the page's background."""
    return np.any(np.abs(pixels.astype(float) - 255.0 * BACKGROUND) > 8, axis=-1)


def orange(pixels: np.ndarray) -> np.ndarray:
    """[H, W] where obj_0 (orange) is: red well above blue."""
    rgb = pixels.astype(int)
    return rgb[..., 0] - rgb[..., 2] > 60


PARAMS = [pytest.param(v, f, id=f"{v}-{f}") for v in VIEWERS for f in FILES]


@needs_chromium
@pytest.mark.parametrize("name,kind", PARAMS)
def test_the_viewer_parses_the_file_and_draws_every_splat(shots, name, kind):
    """No error or warning on the console, the viewer's own count of splats is the file's
    (3 objects of 500; Babylon.js counts each object's padded to a multiple of 16, the unit of
    its instanced draw, with empty splats), nothing fetched, and neither frame is blank."""
    per_object = 500 if name == "three" else -(-500 // 16) * 16
    for when in ("early", "late"):
        seen = shots[name, kind][when]
        ready = ready_line(seen)
        assert (ready["viewer"], ready["objects"]) == (name, "3")
        assert int(ready["splats"]) == 3 * per_object
        assert ready["clips"] == "1" and float(ready["duration"]) == pytest.approx(1.0)
        assert seen["requests"] == []
    for when in ("early", "late"):
        pixels = shots[name, kind][when]["pixels"]
        # the scene drawn on the page's background (on a third or more of the frame), not
        # an overlay such as a loading screen
        assert drawn(pixels).mean() > 0.03, f"{when}: nothing drawn"
        assert drawn(pixels).mean() < 0.67, f"{when}: not the page's background"
        assert orange(pixels).sum() > 300, f"{when}: obj_0 is not on screen"


# What each viewer does with each file, as observed: True where it plays the motion.
ANIMATES = {
    ("three", "skinned"): False,
    ("three", "rigid"): True,
    ("babylon", "skinned"): False,
    ("babylon", "rigid"): True,
}


@needs_chromium
@pytest.mark.parametrize("name,kind", PARAMS)
def test_what_animates_where(shots, name, kind):
    """Frame 0 against the last frame: the rigid file's obj_0 moves right and up on screen in
    both viewers; the skinned file stays at rest in both (they ignore skins and morph targets
    on splats), its pictures unchanged over time."""
    early, late = (shots[name, kind][w]["pixels"] for w in ("early", "late"))
    changed = np.abs(early.astype(int) - late.astype(int)).max(-1) > 8
    (y0, x0), (y1, x1) = (np.argwhere(orange(p)).mean(0) for p in (early, late))
    print(f"{name} {kind}: {changed.mean():.4f} of the pixels changed; obj_0 moved "
          f"({x1 - x0:+.1f}, {y1 - y0:+.1f}) px")  # fmt: skip
    if ANIMATES[name, kind]:
        assert changed.mean() > 0.01
        assert x1 - x0 > 20 and y1 < y0  # right and up, as MOVE says
    else:
        assert changed.mean() < 0.001
        assert abs(x1 - x0) < 1 and abs(y1 - y0) < 1


@needs_chromium
@pytest.mark.parametrize("name", VIEWERS)
def test_the_skinned_file_shows_the_rest_pose(shots, name):
    """Where skins are ignored, the skinned file draws what the rigid file draws at frame 0:
    the rest pose, in place."""
    skinned = shots[name, "skinned"]["late"]["pixels"]
    rest = shots[name, "rigid"]["early"]["pixels"]
    differ = np.abs(skinned.astype(int) - rest.astype(int)).max(-1) > 8
    print(
        f"{name}: the skinned file at t=1 and the rigid file at rest differ in {differ.mean():.5f}"
    )
    assert differ.mean() < 0.005, differ.mean()

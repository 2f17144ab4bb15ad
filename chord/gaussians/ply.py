"""The INRIA 3DGS PLY layout (METHOD §2): ``x, y, z``, optional normals, ``f_dc_0..2``,
``f_rest_*`` (channel-major), ``opacity`` (logit), ``scale_0..2`` (log), ``rot_0..3`` (w, x, y, z);
the SH degree follows from the ``f_rest`` count. Reading, writing, and finding a fitted
object's PLY in CHORD's ``obj_<i>/point_cloud/iteration_<k>/`` folders."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np
from plyfile import PlyData, PlyElement

from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError
from chord.gaussians.gaussian_set import GaussianSet

logger = logging.getLogger(__name__)

#: Number of ``f_rest_*`` properties for SH degree 0..3 (3 * ((d + 1)^2 - 1)).
_REST_COUNT_TO_DEGREE = {0: 0, 9: 1, 24: 2, 45: 3}

_ITERATION_RE = re.compile(r"^iteration_(\d+)$")


def _ply_property_names(sh_degree: int) -> list[str]:
    n_rest = 3 * ((sh_degree + 1) ** 2 - 1)
    return (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(n_rest)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )


def write_ply(path: str | os.PathLike, g: GaussianSet) -> None:
    """METHOD §2. Write ``g`` (N Gaussians) as an INRIA-layout binary little-endian PLY.

    Properties, all float32, in order: ``x y z nx ny nz`` (normals zero), ``f_dc_0..2``,
    ``f_rest_*`` channel-major (index ``c·((d+1)^2−1) + (k−1)``), ``opacity`` (logit),
    ``scale_0..2`` (log), ``rot_0..3`` (w, x, y, z). The file is written to a temporary name
    in the same folder and moved into place, so no partial file is left on error.
    Raises ``ValueError`` naming the field if ``g`` holds non-finite values.
    """
    path = Path(path)
    for name in ("means", "log_scales", "quats", "opacity_logits", "sh"):
        if not np.all(np.isfinite(getattr(g, name))):
            raise ValueError(f"write_ply {path}: GaussianSet.{name} contains non-finite values")
    n = len(g)
    k = g.sh.shape[1]
    names = _ply_property_names(g.sh_degree)
    columns = [g.means[:, i] for i in range(3)]
    columns += [np.zeros(n, np.float32)] * 3
    columns += [g.sh[:, 0, c] for c in range(3)]
    columns += [g.sh[:, kk, c] for c in range(3) for kk in range(1, k)]
    columns += [g.opacity_logits]
    columns += [g.log_scales[:, i] for i in range(3)]
    columns += [g.quats[:, i] for i in range(4)]
    assert len(columns) == len(names)
    data = np.empty(n, dtype=[(name, "<f4") for name in names])
    for name, col in zip(names, columns, strict=True):
        data[name] = col
    ply = PlyData([PlyElement.describe(data, "vertex")], text=False, byte_order="<")

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        ply.write(fh)
    logger.debug("wrote %d Gaussians (SH degree %d) to %s", n, g.sh_degree, path)


def read_ply(path: str | os.PathLike, *, sh_degree_cap: int = 3) -> GaussianSet:
    """METHOD §2. Read an INRIA-layout 3DGS PLY into a GaussianSet (``sh [N, (d+1)^2, 3]``).

    The SH degree follows from the ``f_rest_*`` count (0, 9, 24, 45 → d = 0..3) and is then
    capped at ``sh_degree_cap`` (higher coefficients dropped). Normals and extra properties
    are ignored. Raises ``ValueError`` naming the file (and property) for a missing or
    non-PLY file, a missing ``vertex`` element or property, an unsupported ``f_rest`` count,
    or non-finite values.
    """
    path = Path(path)
    if (
        isinstance(sh_degree_cap, bool)
        or not isinstance(sh_degree_cap, (int, np.integer))
        or sh_degree_cap < 0
    ):
        raise InputError(
            f"read_ply {path}: sh_degree_cap must be an integer >= 0, got {sh_degree_cap!r}"
        )
    if not path.is_file():
        raise InputError(f"read_ply {path}: file does not exist")
    try:
        with open(path, "rb") as fh:
            ply = PlyData.read(fh, mmap="c")  # fast path; columns are copied below
        vertex = ply["vertex"]
    except KeyError:
        raise InputError(f"read_ply {path}: no 'vertex' element") from None
    except Exception as exc:  # plyfile raises a variety of parse errors
        raise InputError(f"read_ply {path}: not a readable PLY file ({exc})") from exc

    present = {prop.name for prop in vertex.properties}
    rest_names = sorted(
        (p for p in present if re.fullmatch(r"f_rest_\d+", p)),
        key=lambda p: int(p[len("f_rest_") :]),
    )
    n_rest = len(rest_names)
    if n_rest not in _REST_COUNT_TO_DEGREE:
        raise InputError(
            f"read_ply {path}: {n_rest} f_rest_* properties; expected 0, 9, 24 or 45 "
            "(SH degree 0..3)"
        )
    if rest_names != [f"f_rest_{i}" for i in range(n_rest)]:
        raise InputError(f"read_ply {path}: f_rest_* properties are not numbered 0..{n_rest - 1}")
    degree = _REST_COUNT_TO_DEGREE[n_rest]
    k_file = (degree + 1) ** 2
    degree_out = min(degree, int(sh_degree_cap))
    k_out = (degree_out + 1) ** 2

    def column(name: str) -> np.ndarray:
        if name not in present:
            raise InputError(f"read_ply {path}: missing vertex property '{name}'")
        try:
            col = np.array(vertex[name], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(f"read_ply {path}: property '{name}' is not numeric") from exc
        if col.ndim != 1:
            raise InputError(f"read_ply {path}: property '{name}' is a list, expected scalar")
        if not np.all(np.isfinite(col)):
            raise InputError(f"read_ply {path}: property '{name}' contains non-finite values")
        return col

    def stack(names: list[str]) -> np.ndarray:
        return np.stack([column(nm) for nm in names], axis=1)

    means = stack(["x", "y", "z"])
    n = len(means)
    sh = np.empty((n, k_out, 3), dtype=np.float32)
    sh[:, 0] = stack(["f_dc_0", "f_dc_1", "f_dc_2"])
    for c in range(3):
        for kk in range(1, k_out):
            sh[:, kk, c] = column(f"f_rest_{c * (k_file - 1) + (kk - 1)}")
    g = GaussianSet(
        means=means,
        log_scales=stack(["scale_0", "scale_1", "scale_2"]),
        quats=stack(["rot_0", "rot_1", "rot_2", "rot_3"]),
        opacity_logits=column("opacity"),
        sh=sh,
    )
    if degree_out < degree:
        logger.debug("read_ply %s: SH degree %d capped to %d", path, degree, degree_out)
    return g


def find_fitted_ply(obj_dir: str | os.PathLike) -> Path:
    """METHOD §2. Locate a fitted 3DGS PLY: ``obj_dir`` itself if it is a ``.ply`` file, else
    ``obj_dir/point_cloud/iteration_<k>/point_cloud.ply`` with the largest integer k.

    Raises ``ValueError`` naming the path and what was expected when nothing matches.
    """
    p = Path(obj_dir)
    if p.is_file():
        if p.suffix.lower() != ".ply":
            raise InputError(f"find_fitted_ply: {p} is a file but not a .ply")
        return p
    if not p.is_dir():
        raise InputError(
            f"find_fitted_ply: {p} does not exist (expected a .ply file or a "
            "folder with point_cloud/iteration_<k>/point_cloud.ply)"
        )
    best: tuple[int, Path] | None = None
    pc = p / "point_cloud"
    if pc.is_dir():
        for child in pc.iterdir():
            match = _ITERATION_RE.match(child.name)
            candidate = child / "point_cloud.ply"
            if match and candidate.is_file():
                k = int(match.group(1))
                if best is None or k > best[0]:
                    best = (k, candidate)
    if best is None:
        raise InputError(
            f"find_fitted_ply: folder {p} has no point_cloud/iteration_<k>/point_cloud.ply"
        )
    logger.debug("find_fitted_ply: %s -> iteration %d", p, best[0])
    return best[1]

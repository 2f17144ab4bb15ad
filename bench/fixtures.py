"""What the bench/ scripts share: the block scene, the tiny Wan prompt embeddings, a demo scene's
method from the config, a method timer, and wall-time and memory readings.

Every script imports it with these four lines, which work both when it is run as
``python bench/<name>.py`` (Python puts bench/ first on sys.path) and when a test imports it as
``bench.<name>`` (bench/ is a package; the repository root is on sys.path under pytest):

    if __package__:
        from bench import fixtures
    else:
        import fixtures

Heavy imports (torch, trimesh, chord) stay inside the functions, so a parent process that only
starts children stays light. Not collected by pytest.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# -- scenes -------------------------------------------------------------------------------------
def block_scene(gaussians: int = 4000, frames: int = 41, *, seed: int = 0, deform: float = 0.0):
    """A block (dynamic, half the Gaussians, 12 control points, a surface sample of every 4th
    Gaussian) on a slab (static, the other half): a chord.motion.model.MotionScene of
    ``frames`` frames. ``deform``: the standard deviation of a random control-point table
    (seeded by ``seed``), 0 for the rest pose."""
    import torch
    import trimesh

    from chord.gaussians import gaussian_set as gs
    from chord.motion.model import DynamicObject, MotionScene
    from chord.render.rasterizer import splat_tensors

    splats = []
    for i, (extents, centre) in enumerate(
        (((0.3, 0.5, 0.3), (0, 0.25, 0)), ((1.2, 0.05, 1.0), (0, -0.03, 0)))
    ):
        mesh = trimesh.creation.box(extents=extents)
        mesh.apply_translation(centre)
        splats.append(splat_tensors(gs.init_from_mesh([mesh], gaussians // 2, seed=seed + i)))
    dyn = splats[0]
    step = max(1, len(dyn["means"]) // 12)
    obj = DynamicObject(
        "obj_0",
        dyn["means"],
        dyn["quats"],
        dyn["means"][::step][:12],
        dyn["means"][::4],
        frame_num=frames,
    )
    if deform:
        with torch.no_grad():
            obj.layer1.cp_deform.normal_(0, deform, generator=torch.Generator().manual_seed(seed))
    return MotionScene(["obj_0", "obj_1"], splats, {"obj_0": obj})


def tiny_text(folder: Path) -> dict:
    """{"prompt", "negative"}: embeddings [L, D] of a short prompt and the default negative
    prompt by the tiny text encoder of a folder of chord.guidance.tiny_models.write_tiny_wan."""
    from chord.guidance import text, wan_folder

    tok, enc = wan_folder.load_text_encoder(folder)
    e, _ = text.encode_prompts(tok, enc, ["a block hops", text.resolve_negative(".")])
    return {"prompt": e[0], "negative": e[1]}


# -- config -------------------------------------------------------------------------------------
def load_config(root: Path = ROOT):
    """``root``'s config/config.yaml and scene sheet as the workflow loads them: a
    chord.config.settings.Config (chord.config.settings.load_file, with relative paths from
    ``root`` rather than
    the current directory)."""
    from chord.config import settings

    return settings.load(settings.read_yaml(root / "config" / "config.yaml"), base=root)


def scene_config(scene: str, root: Path = ROOT, overrides: dict | None = None) -> tuple:
    """(method, guidance) of ``scene`` in ``root``'s config/config.yaml and scene sheet, as the
    workflow builds them (chord.config.settings.load: ``method``, then the sheet row's ``preset``,
    then
    ``scene_overrides``; the demo rows' preset is ``cpu_demo``), with ``overrides`` (method
    keys) over the method."""
    from chord.config import settings

    cfg = load_config(root)
    if scene not in cfg.scenes:
        raise SystemExit(
            f"scene {scene!r} is not in {root}'s scene sheet ({settings.few(cfg.scenes)})"
        )
    method = cfg.scenes[scene].method
    if overrides:
        method = settings.method_from_mapping({**dataclasses.asdict(method), **overrides})
    return method, cfg.guidance


# -- measuring ----------------------------------------------------------------------------------
class MethodTimer:
    """Seconds per named phase, summed over calls, of functions and bound methods it wraps in
    place (:meth:`wrap`). ``clock``: the time source (time.perf_counter: wall seconds,
    time.process_time: CPU seconds); ``sync``: called before each reading (torch.cuda.synchronize
    on a GPU). Unlike chord.training.phase_clock.PhaseClock (phases inside Trainer.step, the last
    call's wall
    time, the CUDA peak reset per phase) it times any callable from outside and leaves the
    memory counters alone."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync=None):
        self.clock, self._sync, self.times = clock, sync, defaultdict(float)

    def sync(self) -> None:
        if self._sync is not None:
            self._sync()

    def wrap(self, obj, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            self.sync()
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.times[key] += self.clock() - start

        setattr(obj, name, timed)


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The least wall seconds of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def rss_bytes() -> int:
    """The process's resident memory now (Linux /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def maxrss_mb() -> float:
    """The process's peak resident memory so far, MB (ru_maxrss: KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

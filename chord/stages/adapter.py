"""What the thin Snakemake scripts share: log routing and the typed scene spec. The
``snakemake`` object is passed in; nothing here imports Snakemake."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from chord.config import settings as cfg
from chord.core.errors import InputError
from chord.plan import scene_plan
from chord.resources.out_of_memory import is_out_of_memory

logger = logging.getLogger("chord")

EXIT_INPUT = 2
# A training ran out of GPU memory: its retry runs on the next leaner memory tier (DESIGN §6).
EXIT_OUT_OF_MEMORY = 3


@contextlib.contextmanager
def stage_logging(log_path: str, history: str | os.PathLike | None = None) -> Iterator[None]:
    """Route ``chord`` logging to the rule's log; an input error ends the job with a one-line
    message (in the log and on stderr) and exit status 2 instead of a traceback, running out of
    GPU memory with exit status 3. Sets the CUDA allocator's configuration first.

    ``history`` (trainings): a file outside the job's outputs that keeps the log of every
    attempt until one completes. Snakemake deletes the rule's log before each attempt (a retry
    on the next tier, a requeued job), so the log starts with the earlier attempts' lines
    copied from it; a completed attempt removes it."""
    from chord.resources import cuda_settings

    cuda_settings.configure_allocator(os.environ)  # before anything starts CUDA (METHOD §15)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = []
    if history is not None:
        history = Path(history)
        history.parent.mkdir(parents=True, exist_ok=True)
        if history.is_file():
            shutil.copyfile(history, log_path)
        handlers.append(logging.FileHandler(history, mode="a"))
    handlers.append(logging.FileHandler(log_path, mode="a" if handlers else "w"))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    if history is not None:
        job = os.environ.get("SLURM_JOB_ID")
        logger.info("attempt started (pid %d%s)", os.getpid(), f", Slurm job {job}" if job else "")
    ok = False
    try:
        yield
    except (InputError, FileNotFoundError) as exc:  # bad input (ConfigError, SceneError, ...)
        logger.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_INPUT)
    except Exception as exc:
        if is_out_of_memory(exc):
            logger.error("out of GPU memory: %s", exc)
            print(f"error: out of GPU memory: {exc}", file=sys.stderr)
            sys.exit(EXIT_OUT_OF_MEMORY)
        logger.exception("stage failed")
        raise
    else:
        ok = True
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        if ok and history is not None:
            history.unlink(missing_ok=True)


#: beside a training's checkpoints: the bad input its last attempt stopped on
INPUT_ERROR_RECORD = "input_error.txt"


@contextlib.contextmanager
def input_error_once(record: str | os.PathLike, attempt: int) -> Iterator[None]:
    """A bad input is not worth another attempt: it is recorded, and a retry of the same run
    (``attempt`` > 1; Snakemake retries a training once per memory tier) stops at once with
    it. A first attempt (a new run, after a fix) starts afresh."""
    record = Path(record)
    if attempt > 1 and record.is_file():
        raise InputError(f"not retried: {record.read_text().strip()}")
    record.unlink(missing_ok=True)
    try:
        yield
    except (InputError, FileNotFoundError) as exc:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(f"{exc}\n")
        raise


def scene_spec(config: dict, name: str) -> cfg.SceneSpec:
    """The typed spec of a scene, or of a run ``<scene>/seed_<s>`` of its seed sweep (its own
    seed), from the workflow config mapping."""
    return scene_plan.run_spec(cfg.load(config), name)


def trained_run(snakemake, inp: dict) -> dict:
    """What the stages after a training take first (export, evaluate): the trained run's files
    in the rule's input record ``inp`` (:func:`chord.plan.scene_plan.record`) and its method."""
    return {
        "scene_json": inp["scene_json"],
        "plys": inp["plys"],
        "voxels": inp["voxels"],
        "state_path": inp["state"],
        "method": scene_spec(snakemake.config, snakemake.wildcards.run).method,
    }


def tiered_job(snakemake, run: str) -> dict:
    """What a job on a memory tier takes (a training, the teacher preview): the config, the
    ``run``, this attempt's tier (a resource, never a param: DESIGN §6) and the environment."""
    return {
        "conf": cfg.load(snakemake.config),
        "scene": run,
        "tier": snakemake.resources.tier,
        "env": os.environ,
    }

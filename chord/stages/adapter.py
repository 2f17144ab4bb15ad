"""What the thin Snakemake scripts share: log routing and the typed scene spec. The
``snakemake`` object is passed in; nothing here imports Snakemake."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from chord import config as cfg
from chord.errors import InputError
from chord.tiers import is_out_of_memory

logger = logging.getLogger("chord")

EXIT_INPUT = 2
# A training ran out of GPU memory: its retry runs on the next leaner memory tier (DESIGN §6).
EXIT_OUT_OF_MEMORY = 3


@contextlib.contextmanager
def stage_logging(log_path: str) -> Iterator[None]:
    """Route ``chord`` logging to the rule's log; an input error ends the job with a one-line
    message (in the log and on stderr) and exit status 2 instead of a traceback, running out of
    GPU memory with exit status 3. Sets the CUDA allocator's configuration first."""
    import os

    from chord import runtime

    runtime.configure_allocator(os.environ)  # before anything starts CUDA (METHOD §15)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    handler = logging.FileHandler(log_path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
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
    finally:
        root.removeHandler(handler)
        handler.close()


def scene_spec(config: dict, scene: str) -> cfg.SceneSpec:
    """The typed spec of ``scene`` from the workflow config mapping."""
    return cfg.load(config).scenes[scene]

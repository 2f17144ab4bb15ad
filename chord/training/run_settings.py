"""How a training runs, apart from what it computes: the operational settings of one training
job, carried as one object from the train stage's entry through
:func:`chord.stages.train.run_stage` to :func:`chord.training.recorded_run.run`. None of them
enters the training hash (:func:`chord.config.result_keys.training_hash`): changing one re-runs
no training."""

from __future__ import annotations

from dataclasses import dataclass

from chord.training.progress import DEFAULT_EVERY_S


@dataclass(frozen=True)
class RunSettings:
    """``scene``: the run the progress lines and records name; ``tier`` (None: not on a
    tier) and ``attempt``: the memory tier and the Snakemake attempt training it (logged,
    recorded in progress and in the hand-off state); ``deadline``: the job's end in seconds
    since the epoch (None: no time limit), before which the run loop stops with a checkpoint;
    ``runtime_h``: the tier's wall time, which the log warns of when the run's projected time
    exceeds it; ``progress_every_s``: seconds between progress lines; ``preview``: the live
    previews' view-only keys (:func:`chord.training.live_preview.view_keys`; None: none);
    ``tensorboard``: TensorBoard scalars beside the loss log."""

    scene: str = "-"
    tier: str | None = None
    attempt: int = 1
    deadline: float | None = None
    runtime_h: float | None = None
    progress_every_s: float = DEFAULT_EVERY_S
    preview: dict | None = None
    tensorboard: bool = False

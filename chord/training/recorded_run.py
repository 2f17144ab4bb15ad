"""A stage's iterations (:func:`chord.training.run_loop.run`) with rank 0's records around
them: the loss log beside the checkpoints (:mod:`chord.training.loss_log`), TensorBoard scalars
(:mod:`chord.training.scalars`), the progress lines and records
(:class:`chord.training.progress.Progress`) and live previews
(:mod:`chord.training.live_preview`)."""

from __future__ import annotations

from pathlib import Path

import torch

from chord.training import device_report, progress, run_loop, scalars
from chord.training.loss_log import LOSS_HISTORY, LossLog, timing_columns
from chord.training.run_settings import RunSettings


def run(
    trainer,
    start: int,
    stop: int,
    *,
    stage: str,
    config_hash: str,
    folder: Path,
    guidance,
    writer: bool = True,
    run_settings: RunSettings | None = None,
) -> int:
    """Iterations [start, stop) of ``stage`` (early stop honoured) with the checkpoints of
    configuration ``config_hash`` in ``folder``; returns the last iteration run (``start - 1``
    when none is left).

    The ``writer`` (rank 0) keeps the loss log (:data:`LOSS_HISTORY` in ``folder``; rows
    before ``start`` kept) and with ``run_settings.tensorboard`` its scalars, and reports
    progress (a line every ``progress_every_s`` seconds naming the run's ``scene``, ``tier``
    and ``attempt``; a ``failed`` event when the run raises anything but an interruption) with
    live previews when ``preview`` asks for them (all of ``run_settings``). ``guidance`` (its
    non-finite step limit and fallback) and ``run_settings``' ``deadline``, ``runtime_h`` and
    ``tier``: as :func:`chord.training.run_loop.run` takes them. None: the defaults."""
    rs = run_settings or RunSettings()
    last = run_loop.last_iteration(trainer.method, stop)
    columns = timing_columns(trainer.memory, torch.cuda.is_available())
    log = LossLog(Path(folder) / LOSS_HISTORY, start, columns) if writer else None
    board = (
        scalars.Scalars(Path(folder) / scalars.FOLDER, stage, start, log)
        if log and rs.tensorboard
        else None
    )
    watch = None
    try:
        if start > last:
            return start - 1
        if writer:
            watch = progress.Progress(
                folder,
                scene=rs.scene,
                stage=stage,
                start=start,
                last=last,
                tier=rs.tier,
                attempt=rs.attempt,
                every_s=rs.progress_every_s,
                gpu_peak=device_report.gpu_peak_gb(trainer.device),
            )
            if rs.preview and rs.preview["every"]:
                from chord.training import live_preview

                live_preview.attach(watch, trainer, rs.preview)
        last = run_loop.run(
            trainer,
            start,
            stop,
            config_hash=config_hash,
            checkpoint_dir=folder,
            log=board or log,
            writer=writer,
            max_nonfinite_steps=guidance.max_nonfinite_steps,
            fallback=guidance.nonfinite_fallback,
            deadline=rs.deadline,
            runtime_h=rs.runtime_h,
            tier=rs.tier,
            progress=watch,
        )
    except Exception as exc:
        if watch is not None and not isinstance(exc, run_loop.Interrupted):
            watch.event("failed", watch.latest.get("it", start), error=type(exc).__name__)
        raise
    finally:
        if log is not None:
            log.close()
        if board is not None:
            board.close()
    if watch is not None:
        watch.finish(last)
    return last

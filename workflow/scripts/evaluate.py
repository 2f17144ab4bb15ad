# Adapter: rule evaluate -> chord.stages.evaluate.run
from pathlib import Path

from chord.plan import scene_plan
from chord.stages import evaluate
from chord.stages.adapter import stage_logging, trained_run

with stage_logging(snakemake.log[0]):
    inp, out = scene_plan.record(snakemake.input.items()), snakemake.output
    evaluate.run(
        **trained_run(snakemake, inp),
        ref_png=inp["ref"],
        loss_logs=inp["loss_logs"],
        motion_json=inp.get("motion"),
        out_json=Path(out.metrics),
        out_frame0=Path(out.frame0),
        out_losses=Path(out.losses),
        out_interaction=Path(out.interaction),
    )

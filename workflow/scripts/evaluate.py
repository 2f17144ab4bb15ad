# Adapter: rule evaluate -> chord.stages.evaluate.run
from pathlib import Path

from chord.plan import scene_plan
from chord.stages import evaluate
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.run)
    inp, out = scene_plan.record(snakemake.input.items()), snakemake.output
    evaluate.run(
        scene_json=inp["scene_json"],
        plys=inp["plys"],
        voxels=inp["voxels"],
        state_path=inp["state"],
        ref_png=inp["ref"],
        loss_logs=inp["loss_logs"],
        motion_json=inp.get("motion"),
        method=spec.method,
        out_json=Path(out.metrics),
        out_frame0=Path(out.frame0),
        out_losses=Path(out.losses),
        out_interaction=Path(out.interaction),
    )

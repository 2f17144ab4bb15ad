# Adapter: rule reference -> chord.stages.reference.run
from pathlib import Path

from chord.plan import scene_plan
from chord.stages import reference
from chord.stages.adapter import scene_spec, stage_logging

with stage_logging(snakemake.log[0]):
    spec = scene_spec(snakemake.config, snakemake.wildcards.scene)
    inp = scene_plan.record(snakemake.input.items())
    reference.run(
        scene_json=inp["scene_json"],
        plys=inp["plys"],
        out_png=Path(snakemake.output.png),
        out_orbit=Path(snakemake.output.orbit),
        method=spec.method,
    )

# Adapter: rule teacher_preview -> chord.stages.preview.run_job, on the scene's memory tier
from pathlib import Path

from chord.plan import scene_plan
from chord.stages import preview
from chord.stages.adapter import stage_logging, tiered_job

with stage_logging(snakemake.log[0]):
    inp = scene_plan.record(snakemake.input.items())
    preview.run_job(
        **tiered_job(snakemake, snakemake.wildcards.scene),
        inputs={"scene_json": inp["scene_json"], "plys": inp["plys"], "ref_png": inp["ref"], "text_path": inp["text"]},
        out_mp4=Path(snakemake.output.mp4),
        out_png=Path(snakemake.output.png),
    )

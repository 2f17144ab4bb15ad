# Adapter: rule preview_strip -> chord.stages.preview_strip.run
from pathlib import Path

from chord.stages import preview_strip
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    preview_strip.run(
        previews=[Path(p) for p in snakemake.input.previews],
        out_png=Path(snakemake.output.png),
    )

# Adapter: rule condition -> chord.stages.condition.run (prompts travel as data, not shell). The
# job's environment goes along: the stage takes the GPU the rule asked for, or hides CUDA.
import os
from pathlib import Path

from chord.config import settings
from chord.stages import condition
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    conf = settings.load(snakemake.config)
    spec = conf.scenes[snakemake.wildcards.scene]
    condition.run(
        out=Path(snakemake.output[0]),
        prompt=spec.prompt,
        n_prompt=spec.n_prompt,
        guidance=conf.guidance,
        method=spec.method,
        scene=spec.scene,
        env=os.environ,
    )

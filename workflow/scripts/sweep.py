# Adapter: rule sweep -> chord.stages.sweep.run
from pathlib import Path

from chord.config import settings
from chord.plan import scene_plan
from chord.stages import sweep
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    inp, out = scene_plan.record(snakemake.input.items()), snakemake.output
    sweep.run(
        scene=snakemake.wildcards.scene,
        videos={int(s): p for s, p in inp["videos"].items()},
        metrics={int(s): p for s, p in inp["metrics"].items()},
        rule=settings.load(snakemake.config).sweep,
        out_png=Path(out.png),
        out_tsv=Path(out.tsv),
        out_json=Path(out.best),
    )

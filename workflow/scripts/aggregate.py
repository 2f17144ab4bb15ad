# Adapter: rule aggregate -> chord.stages.aggregate.run
from pathlib import Path

from chord.plan import scene_plan
from chord.stages import aggregate
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    inp, runs = scene_plan.record(snakemake.input.items()), snakemake.params.runs
    aggregate.run(
        metrics={r: inp["metrics"][r] for r in runs},
        loss_logs={r: {st: inp["loss_logs"][f"{r}_{st}"] for st in scene_plan.STAGES if f"{r}_{st}" in inp["loss_logs"]} for r in runs},
        out_tsv=Path(snakemake.output.tsv),
        out_metrics_png=Path(snakemake.output.bars),
        out_losses_png=Path(snakemake.output.losses),
    )

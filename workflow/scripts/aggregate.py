# Adapter: rule aggregate -> chord.stages.aggregate.run
from pathlib import Path

from chord import plan
from chord.stages import aggregate
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    inp, scenes = plan.record(snakemake.input.items()), snakemake.params.scenes
    aggregate.run(
        metrics={s: inp["metrics"][s] for s in scenes},
        loss_logs={s: {st: inp["loss_logs"][f"{s}_{st}"] for st in plan.STAGES if f"{s}_{st}" in inp["loss_logs"]} for s in scenes},
        out_tsv=Path(snakemake.output.tsv),
        out_metrics_png=Path(snakemake.output.bars),
        out_losses_png=Path(snakemake.output.losses),
    )

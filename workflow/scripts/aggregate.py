# Adapter: rule aggregate -> chord.stages.aggregate.run
from pathlib import Path

from chord.stages import aggregate
from chord.stages.adapter import stage_logging

with stage_logging(snakemake.log[0]):
    inp, scenes = dict(snakemake.input.items()), snakemake.params.scenes
    aggregate.run(
        metrics={s: Path(inp[f"metrics_{s}"]) for s in scenes},
        loss_logs={
            s: {st: Path(inp[f"losses_{s}_{st}"]) for st in ("coarse", "fine") if f"losses_{s}_{st}" in inp}
            for s in scenes
        },
        out_tsv=Path(snakemake.output.tsv),
        out_metrics_png=Path(snakemake.output.bars),
        out_losses_png=Path(snakemake.output.losses),
    )

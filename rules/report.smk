localrules:
    aggregate,


rule aggregate:
    input:
        unpack(aggregate_inputs),
        code=code("aggregate"),
    output:
        tsv=report(
            results_layout.metrics_tsv(RESULTS),
            caption="../workflow/report/metrics_tsv.rst",
            category="all scenes",
            subcategory="summary",
            labels={"figure": "metrics table"},
        ),
        bars=report(
            results_layout.metrics_png(RESULTS),
            caption="../workflow/report/metric_bars.rst",
            category="all scenes",
            subcategory="summary",
            labels={"figure": "metrics across scenes"},
        ),
        losses=report(
            results_layout.losses_png(RESULTS),
            caption="../workflow/report/losses_all.rst",
            category="all scenes",
            subcategory="summary",
            labels={"figure": "training losses across scenes"},
        ),
    log:
        results_layout.results_log(RESULTS, "aggregate"),
    benchmark:
        results_layout.results_bench(RESULTS, "aggregate")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        runs=runs(),
    script:
        "../workflow/scripts/aggregate.py"

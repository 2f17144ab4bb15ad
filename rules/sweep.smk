# A seed sweep's comparison and choice (issue 24): a swept scene's seeds side by side, and the
# seed the config's `sweep` rule picks. Local: it reads a few frames and small JSON files.
localrules:
    sweep,


rule sweep:
    input:
        unpack(sweep_inputs),
        code=code("sweep"),
    output:
        png=report(
            results_layout.sweep_png(RESULTS, "{scene}"),
            caption="../workflow/report/sweep.rst",
            category="{scene}",
            subcategory="seeds",
            labels={"scene": "{scene}", "figure": "seeds side by side"},
        ),
        tsv=results_layout.sweep_tsv(RESULTS, "{scene}"),
        best=results_layout.best_json(RESULTS, "{scene}"),
    log:
        results_layout.log(RESULTS, "{scene}", "sweep"),
    benchmark:
        results_layout.bench(RESULTS, "{scene}", "sweep")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        selection=lambda wc: sweep_rule(),
    script:
        "../workflow/scripts/sweep.py"

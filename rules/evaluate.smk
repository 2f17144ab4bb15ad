rule evaluate:
    input:
        unpack(planned("evaluate")),
        code=code("evaluate"),
    output:
        metrics=report(
            results_layout.metrics_json(RESULTS, "{run}"),
            caption="../workflow/report/metrics.rst",
            category="{run}",
            subcategory="metrics",
            labels={"scene": "{run}", "figure": "metrics.json"},
        ),
        frame0=report(
            results_layout.frame0_png(RESULTS, "{run}"),
            caption="../workflow/report/frame0.rst",
            category="{run}",
            subcategory="plots",
            labels={"scene": "{run}", "figure": "reference and frame 0"},
        ),
        losses=report(
            results_layout.loss_png(RESULTS, "{run}"),
            caption="../workflow/report/losses.rst",
            category="{run}",
            subcategory="plots",
            labels={"scene": "{run}", "figure": "training losses"},
        ),
        interaction=report(
            results_layout.interaction_png(RESULTS, "{run}"),
            caption="../workflow/report/interaction.rst",
            category="{run}",
            subcategory="plots",
            labels={"scene": "{run}", "figure": "interaction between objects"},
        ),
    log:
        results_layout.log(RESULTS, "{run}", "evaluate"),
    benchmark:
        results_layout.bench(RESULTS, "{run}", "evaluate")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.run, "evaluate"),
    script:
        "../workflow/scripts/evaluate.py"


# The training's live previews as one strip for the report's scene page (issue 48): its inputs
# are the previews the finished training wrote (training_previews), so an existing results
# tree gets the strip without training again.
localrules:
    preview_strip,


rule preview_strip:
    input:
        # the state orders it after the training (and re-runs it with a new one)
        state=lambda wc: str(plan(wc.run).final_state()),
        previews=training_previews,
        code=code("preview_strip"),
    output:
        png=report(
            results_layout.preview_strip_png(RESULTS, "{run}"),
            caption="../workflow/report/preview_strip.rst",
            category="{run}",
            subcategory="plots",
            labels={"scene": "{run}", "figure": "live previews of the training"},
        ),
    log:
        results_layout.log(RESULTS, "{run}", "preview_strip"),
    conda:
        "../workflow/envs/chord.yaml"
    script:
        "../workflow/scripts/preview_strip.py"

rule evaluate:
    input:
        unpack(planned("evaluate")),
        code=code("evaluate"),
    output:
        metrics=report(
            P.metrics_json(RESULTS, "{scene}"),
            caption="../workflow/report/metrics.rst",
            category="{scene}",
            subcategory="metrics",
            labels={"scene": "{scene}", "figure": "metrics.json"},
        ),
        frame0=report(
            P.frame0_png(RESULTS, "{scene}"),
            caption="../workflow/report/frame0.rst",
            category="{scene}",
            subcategory="plots",
            labels={"scene": "{scene}", "figure": "reference and frame 0"},
        ),
        losses=report(
            P.loss_png(RESULTS, "{scene}"),
            caption="../workflow/report/losses.rst",
            category="{scene}",
            subcategory="plots",
            labels={"scene": "{scene}", "figure": "training losses"},
        ),
        interaction=report(
            P.interaction_png(RESULTS, "{scene}"),
            caption="../workflow/report/interaction.rst",
            category="{scene}",
            subcategory="plots",
            labels={"scene": "{scene}", "figure": "interaction between objects"},
        ),
    log:
        P.log(RESULTS, "{scene}", "evaluate"),
    benchmark:
        P.bench(RESULTS, "{scene}", "evaluate")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "evaluate"),
    script:
        "../workflow/scripts/evaluate.py"

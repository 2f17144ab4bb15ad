rule gaussians:
    input:
        unpack(planned("geometry")),
        fitted=fitted_ply,
        code=code("gaussians"),
    output:
        results_layout.gaussians_ply(RESULTS, "{scene}", "{obj}"),
    log:
        results_layout.log(RESULTS, "{scene}", "gaussians_{obj}"),
    benchmark:
        results_layout.bench(RESULTS, "{scene}", "gaussians_{obj}")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "gaussians"),
    script:
        "../workflow/scripts/gaussians.py"

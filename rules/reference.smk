rule reference:
    input:
        unpack(planned("reference")),
        code=code("reference"),
    output:
        png=results_layout.reference_png(RESULTS, "{scene}"),
        orbit=results_layout.static_orbit_mp4(RESULTS, "{scene}"),
    log:
        results_layout.log(RESULTS, "{scene}", "reference"),
    benchmark:
        results_layout.bench(RESULTS, "{scene}", "reference")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "reference"),
    script:
        "../workflow/scripts/reference.py"

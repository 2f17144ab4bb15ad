# The scene's 3D viewers: self-contained HTML pages playing its skinned GLB (issue 16) and its
# Gaussians as splats (issue 24). Local: well under a second; both pages are report results.
localrules:
    viewer,


rule viewer:
    input:
        glb=results_layout.dynamic_skinned_glb(RESULTS, "{run}"),
        splats=results_layout.dynamic_splats_glb(RESULTS, "{run}"),
        code=code("viewer"),
    output:
        html=report(
            results_layout.viewer_html(RESULTS, "{run}"),
            caption="../workflow/report/viewer.rst",
            category="{run}",
            subcategory="3D",
            labels={"scene": "{run}", "view": "3D viewer"},
        ),
        splats=report(
            results_layout.splats_html(RESULTS, "{run}"),
            caption="../workflow/report/splats.rst",
            category="{run}",
            subcategory="3D",
            labels={"scene": "{run}", "view": "splat player"},
        ),
    log:
        results_layout.log(RESULTS, "{run}", "viewer"),
    benchmark:
        results_layout.bench(RESULTS, "{run}", "viewer")
    conda:
        "../workflow/envs/chord.yaml"
    script:
        "../workflow/scripts/viewer.py"

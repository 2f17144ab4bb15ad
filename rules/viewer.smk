# The scene's 3D viewer: one self-contained HTML page playing its animated GLB (issue 16).
# Local: it takes well under a second, and the page is a report result.
localrules:
    viewer,


rule viewer:
    input:
        glb=P.dynamic_skinned_glb(RESULTS, "{scene}"),
        code=code("viewer"),
    output:
        html=report(
            P.viewer_html(RESULTS, "{scene}"),
            caption="../workflow/report/viewer.rst",
            category="{scene}",
            subcategory="3D",
            labels={"scene": "{scene}", "view": "3D viewer"},
        ),
    log:
        P.log(RESULTS, "{scene}", "viewer"),
    benchmark:
        P.bench(RESULTS, "{scene}", "viewer")
    conda:
        "../workflow/envs/chord.yaml"
    script:
        "../workflow/scripts/viewer.py"

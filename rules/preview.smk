# The teacher preview: `snakemake preview` samples what the teacher makes of each scene before a
# long run (not part of the default targets). On the scene's memory tier, like its training.


rule teacher_preview:
    input:
        unpack(planned("preview")),
        code=code("preview"),
    output:
        mp4=report(
            results_layout.teacher_mp4(RESULTS, "{scene}"),
            caption="../workflow/report/teacher.rst",
            category="{scene}",
            subcategory="teacher preview",
            labels={"scene": "{scene}", "figure": "teacher preview (video)"},
        ),
        png=report(
            results_layout.teacher_png(RESULTS, "{scene}"),
            caption="../workflow/report/teacher.rst",
            category="{scene}",
            subcategory="teacher preview",
            labels={
                "scene": "{scene}",
                "figure": "teacher preview (first, middle, last frame)",
            },
        ),
    log:
        results_layout.log(RESULTS, "{scene}", "teacher_preview"),
    benchmark:
        results_layout.bench(RESULTS, "{scene}", "teacher_preview")
    conda:
        "../workflow/envs/chord.yaml"
    resources:
        gpu=1,
        tier=tier_resource("coarse", "tier"),
        mem_mb=preview_mem_mb,
        runtime=tier_resource("coarse", "runtime"),
        gpu_model=tier_resource("coarse", "gpu_model"),
        slurm_partition=tier_resource("coarse", "slurm_partition"),
    params:
        settings=lambda wc: preview_params(wc.scene),
    script:
        "../workflow/scripts/preview.py"


rule preview:
    input:
        [results_layout.teacher_mp4(RESULTS, s) for s in SCENES],

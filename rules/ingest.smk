rule ingest:
    input:
        unpack(planned("ingest")),
        code=code("ingest"),
    output:
        json=results_layout.scene_json(RESULTS, "{scene}"),
        meshes=directory(results_layout.meshes_dir(RESULTS, "{scene}")),
    log:
        results_layout.log(RESULTS, "{scene}", "ingest"),
    benchmark:
        results_layout.bench(RESULTS, "{scene}", "ingest")
    conda:
        "../workflow/envs/chord.yaml"
    # the reader refuses a file whose estimated peak exceeds it, naming the figure
    # (chord.gltf.memory_budget; more: snakemake --set-resources ingest:mem_mb=N)
    resources:
        mem_mb=INGEST_MEM_MB,
    params:
        method=lambda wc: stage_params(wc.scene, "ingest"),
    script:
        "../workflow/scripts/ingest.py"

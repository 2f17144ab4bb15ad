rule ingest:
    input:
        unpack(planned("ingest")),
        code=code("ingest"),
    output:
        json=P.scene_json(RESULTS, "{scene}"),
        meshes=directory(P.meshes_dir(RESULTS, "{scene}")),
    log:
        P.log(RESULTS, "{scene}", "ingest"),
    benchmark:
        P.bench(RESULTS, "{scene}", "ingest")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: stage_params(wc.scene, "ingest"),
    script:
        "../workflow/scripts/ingest.py"

rule condition:
    input:
        code=code("condition"),
    output:
        results_layout.text_condition(RESULTS, "{scene}"),
    log:
        results_layout.log(RESULTS, "{scene}", "condition"),
    benchmark:
        results_layout.bench(RESULTS, "{scene}", "condition")
    conda:
        "../workflow/envs/chord.yaml"
    # a GPU where the Wan folder's UMT5 encodes on one (method.t5_cpu false): the stage takes
    # a free one as a training does; with gpu=0 it hides CUDA
    resources:
        **CONDITION_GPU_KIND,
        gpu=lambda wc: condition_gpus(wc.scene),
        mem_mb=lambda wc: CONDITION_MEM_MB,
    params:
        text=lambda wc: condition_params(wc.scene),
    script:
        "../workflow/scripts/condition.py"

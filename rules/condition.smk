rule condition:
    input:
        code=code("condition"),
    output:
        P.text_condition(RESULTS, "{scene}"),
    log:
        P.log(RESULTS, "{scene}", "condition"),
    benchmark:
        P.bench(RESULTS, "{scene}", "condition")
    conda:
        "../workflow/envs/chord.yaml"
    resources:
        mem_mb=lambda wc: CONDITION_MEM_MB,
    params:
        text=lambda wc: condition_params(wc.scene),
    script:
        "../workflow/scripts/condition.py"

rule train_coarse:
    input:
        unpack(train_inputs),
        code=code("train"),
    output:
        state=P.train_state(RESULTS, "{scene}", "coarse"),
        losses=P.train_losses(RESULTS, "{scene}", "coarse"),
    log:
        P.log(RESULTS, "{scene}", "train_coarse"),
    benchmark:
        P.bench(RESULTS, "{scene}", "train_coarse")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: train_params(wc.scene),
        checkpoints=lambda wc: str(P.checkpoints(RESULTS, wc.scene, "coarse")),
    script:
        "../workflow/scripts/train.py"


rule train_fine:
    input:
        unpack(train_inputs),
        handoff=P.train_state(RESULTS, "{scene}", "coarse"),
        code=code("train"),
    output:
        state=P.train_state(RESULTS, "{scene}", "fine"),
        losses=P.train_losses(RESULTS, "{scene}", "fine"),
    log:
        P.log(RESULTS, "{scene}", "train_fine"),
    benchmark:
        P.bench(RESULTS, "{scene}", "train_fine")
    conda:
        "../workflow/envs/chord.yaml"
    params:
        method=lambda wc: train_params(wc.scene),
        checkpoints=lambda wc: str(P.checkpoints(RESULTS, wc.scene, "fine")),
    script:
        "../workflow/scripts/train.py"

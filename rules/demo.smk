# The bundled procedural demo scenes, generated when the sheet uses them and they are missing.
# Local: under a second each, without torch; a cluster job would wait in the queue for it.
for _name in demo.DEMO_SCENES:

    rule:
        name:
            f"demo_{_name}"
        input:
            code=code("demo"),
        output:
            [f"{DEMO_DIR}/{_name}/{f}" for f in demo.demo_files(_name)],
        log:
            f"{DEMO_DIR}/logs/{_name}.log",
        localrule: True
        conda:
            "../workflow/envs/chord.yaml"
        params:
            name=_name,
            frame_num=demo_frame_num(_name),
        script:
            "../workflow/scripts/demo.py"

"""The workflow's stages, one module each with a ``run()`` that workflow/scripts/ call (the
package files a stage's result depends on, its rule's code input:
:mod:`chord.plan.code_sources`)."""

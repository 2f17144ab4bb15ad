"""The workflow's stages, one module each with a ``run()`` that workflow/scripts/ call.
:func:`sources` lists the package files a stage's result depends on (rule code)."""

from chord.sources import EXEMPT, STAGES, digest, sources, sources_by_stage

__all__ = ["EXEMPT", "STAGES", "digest", "sources", "sources_by_stage"]

"""Checks before work starts: a training's preflight, ``chord doctor``, a scene's data."""

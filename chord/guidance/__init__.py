"""The teacher that distils motion (DESIGN §4, METHOD §9–§15).

Two implementations of one small interface, chosen by ``guidance.backend``:

- ``encode_video(video [T, 3, H, W], *, checkpoint=False) -> z``: differentiable latents of a
  rendered video (``checkpoint``: trade compute for a smaller graph, same result);
- ``condition(video, *, viewmat, K, background) -> cond``: per-video conditioning, without
  gradient (Wan: the image condition y from frame 0; oracle: the target latent z*);
- ``velocity(z_t [B, ...], t, conds, text, cfg_scale) -> v̂``: the guided velocity;
- ``unload()``: release what the DiT passes made resident.

:class:`~chord.guidance.wan.WanGuidance` is the product (Wan 2.2 I2V A14B from a diffusers
folder); :class:`~chord.guidance.oracle.OracleGuidance` is the exact teacher toward a scene's
scripted motion, which makes distillation measurable on a CPU.
"""

"""chord: animate static multi-object 3D scenes by distilling Wan 2.2 motion into 3D Gaussians.

The package is one folder per concern, in layers. This list is their one declaration, bottom
first: a module imports (at its top or inside a function) only from its own folder or the
folders before it, and no modules import each other in a circle (``tests/test_layers.py``).

1. ``core``: the bad-input error, atomic file writes, quaternions, image and video files
2. ``config``: the schemas, the validated settings, the scene sheet, each stage's result keys
3. ``gaussians``: Gaussian sets and their surface initialisation, mesh colour, 3DGS PLY
4. ``resources``: GPUs, host RAM, CUDA settings, the peak-memory model, jobs, memory tiers
5. ``render``: the rasterizer and its backends, cameras, views of a scene
6. ``gltf``: the glTF container, users' files checked and made plain, the animated writers
7. ``motion``: voxels, control points, layers, the motion scene, its state, regularisers
8. ``scene``: a user's meshes ingested, the procedural demo scenes
9. ``guidance``: the teacher: RF-SDS, Wan 2.2, the Tiny VAE, the oracle, tiny test models
10. ``training``: the Trainer, the run loop, checkpoints, ranks, time limits, progress
11. ``export``: a trained scene loaded, its videos, PLY sequences and animated GLBs
12. ``plan``: a scene's plan, the results layout, the workflow's jobs, each stage's sources
13. ``evaluation``: the metrics, their file, figures, a sweep's chosen seed
14. ``checks``: a training's preflight, ``chord doctor``, a scene's data
15. ``stages``: one ``run()`` per Snakemake rule, and what their adapters share
16. ``cli``: the ``chord`` command, ``chord status``, CHORD's own ``chord train``
"""

__version__ = "0.1.0"

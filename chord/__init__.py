"""chord: animate static multi-object 3D scenes by distilling Wan 2.2 motion into 3D Gaussians."""

__version__ = "0.1.0"

"""Differentiable Gaussian rasterization (METHOD §8): the backends, cameras, and views of a
scene."""

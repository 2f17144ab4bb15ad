"""Metrics of a trained motion, their file, figures, and the seed a sweep keeps."""

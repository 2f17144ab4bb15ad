"""3D Gaussian sets: surface initialisation from meshes, mesh colour, the 3DGS PLY layout."""

"""A trained scene's exports: its motion loaded onto the stage files, GIF, PLY sequences
and animated GLBs."""

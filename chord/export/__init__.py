"""A trained scene's exports: its motion loaded onto the stage files, videos, GIF, PLY sequences
and animated GLBs."""

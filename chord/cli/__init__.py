"""The ``chord`` command line: stage subcommands, ``chord status``, and CHORD's own ``chord
train``."""

"""The one error type for bad input: a config value, a command-line flag, or a file a user gave
(or a stage wrote that a user mixed up). The ``chord`` command and the Snakemake adapters turn
it into a one-line message naming the file, field or flag and exit status 2; any other
exception is a bug and shows its traceback."""


class InputError(ValueError):
    """Bad input; the message names where it is and what is wrong."""

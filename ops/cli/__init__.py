"""The `pulse` command line: thin commands over the library, one module per group of
commands, one registry of them (``ops.cli.registry``), each command's --help its
function's docstring (a summary, details, examples).

Each command is a record (``ops.cli.declare.Command``): its name and group, its
arguments, the declared API operations it calls, and its function. `python -m
ops.cli.reference` writes the CLI reference (docs/cli.md) from those records.
"""

from ops.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]

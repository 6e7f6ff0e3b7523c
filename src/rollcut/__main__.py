"""``python -m rollcut``: the command line, as the ``rollcut`` script."""

from .cli import main

main()

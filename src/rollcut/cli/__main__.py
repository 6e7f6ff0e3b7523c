"""``python -m rollcut.cli``."""

from . import main

main()

"""``python -m rollcut.integrations.trl``: see :mod:`._main`."""

import sys

from ._main import main

sys.exit(main())

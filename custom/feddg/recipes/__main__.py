"""``python -m feddg.recipes``: see :mod:`feddg.recipes.main`."""

import sys

from feddg.recipes.main import main

sys.exit(main())

"""``python -m knnkit``: the ``knnkit`` command."""

import sys

from .cli import main

sys.exit(main())

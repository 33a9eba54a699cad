"""``python -m egraft.cli``: the same command as the ``egraft`` console script."""

import sys

from . import main

sys.exit(main())

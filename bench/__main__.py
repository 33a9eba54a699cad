"""``python -m bench``: every benchmark, then the results page (bench/suite.py says how)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from suite import main  # noqa: E402

sys.exit(main())

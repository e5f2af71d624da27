"""``python -m rabit_py.launcher``: the same as ``rabit-run``."""

import sys

from . import main

sys.exit(main())

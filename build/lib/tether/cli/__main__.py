"""``python -m tether.cli``: the same as the ``tether`` console script."""

import sys

from tether.cli import main

sys.exit(main())

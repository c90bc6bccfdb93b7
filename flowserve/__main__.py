"""``python -m flowserve``: the ``flowserve`` command line."""

import sys

from flowserve.cli import main

sys.exit(main())

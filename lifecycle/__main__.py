"""Entry point of ``python -m lifecycle``."""

import sys

from lifecycle._tools.cli import main

sys.exit(main())

"""Entry point of ``python -m lifecycle``."""

import sys

from lifecycle._cli import main

sys.exit(main())

"""Entry point of ``python -m lifecycle``."""

import sys

from lifecycle._tools.cli.main import main

sys.exit(main())

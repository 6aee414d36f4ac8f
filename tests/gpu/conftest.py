"""The GPU check (``make gpu-check``): collected only when ``LIFECYCLE_GPU_CHECK=1``, each test skipped without CUDA.

Normal runs (``make test``, ``make test-slow``) never import these modules.
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("LIFECYCLE_GPU_CHECK") == "1" else ["test_*.py"]

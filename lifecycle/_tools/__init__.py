"""The command line: ``cli`` dispatches to ``demo``, ``show`` and ``diagrams``."""

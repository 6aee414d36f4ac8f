"""Liveness: a monitor process per rank that names a stopped, spinning, hung or dead rank and releases the others.

``rank`` is the training process's side (progress marks, starting and stopping the
monitor), ``monitor`` the monitor process itself and ``wire`` its store client (standard
library only). See
docs/liveness.md.
"""

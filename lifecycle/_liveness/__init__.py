"""Liveness: a monitor process per rank that names a stopped, spinning, hung or dead rank and releases the others.

A feature above the core: it imports no other layer, and the core never imports it
(``Session.progress`` reaches the marks through ``progress_sink``, a seam the core
declares and ``pretrain`` sets). ``settings`` is what a rank tells its monitor (built
once, passed whole), ``rank`` the training process's side (progress marks, starting and
stopping the monitor), ``monitor`` the monitor process itself and ``wire`` its store
client (standard library only). See docs/liveness.md.
"""

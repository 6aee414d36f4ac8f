"""``pretrain`` and what it is made of: its configuration, callbacks, the demo model, the loop.

``config`` and ``callbacks`` import no torch at module level; ``model`` and ``pretrain`` do.
"""

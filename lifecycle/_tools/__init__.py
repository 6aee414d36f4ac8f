"""``python -m lifecycle``: a folder per product.

``cli/`` dispatches to the three commands and renders the help; ``demo/`` trains the
demo model under torchrun and reports the run; ``show/`` reads journals into a model
and draws views of it; ``diagrams/`` draws the transition table (for ``diagrams`` and
``show``). The launcher they share with ``lifecycle.testing`` is ``lifecycle._launch``.
"""

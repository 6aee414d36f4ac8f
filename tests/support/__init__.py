"""The suite's toolkit: one of each helper, built on ``lifecycle.testing``.

- ``configs``: tiny configurations, the one group timeout, fast Wrapper settings.
- ``launch``: the repository's paths, the worker launcher, bounded subprocesses.
- ``probes``: what is alive, and a recorder of torch.distributed / megatron-core calls.
- ``session``: driving a session to a state; ``PlannedFailure``, the failure a test raises.
- ``journals``: journal fixtures (a v1 file).
- ``stores``: a store write read back before a monitor looks (``settled_set``).
- ``internals``, ``torch_internals``: the suite's one door to lifecycle's private modules
  (torch-free, and those that import torch). A test of one private module imports that
  module itself; anything else reaches behind the public names through these two
  (``tests/test_private_imports.py`` keeps it so).
"""

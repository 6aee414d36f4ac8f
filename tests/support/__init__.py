"""The suite's toolkit: one of each helper, built on ``lifecycle.testing``.

- ``configs``: tiny configurations, the one group timeout, fast Wrapper settings.
- ``launch``: the repository's paths, the worker launcher, bounded subprocesses.
- ``probes``: what is alive, and a recorder of torch.distributed / megatron-core calls.
- ``session``: driving a session to a state; ``PlannedFailure``, the failure a test raises.
- ``journals``: journal fixtures (a v1 file).
"""

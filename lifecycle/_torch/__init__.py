"""The only lifecycle effects on torch.distributed and megatron-core.

``config`` (no torch: validated before anything is acquired) → ``store`` (rendezvous
stores and per-attempt prefixes) → ``groups`` (aborting and forgetting process groups) →
``megatron`` (megatron-core's globals) → ``actions`` (``TorchActions``, the facade the
session drives). Importing this package loads no torch; its modules do.
"""

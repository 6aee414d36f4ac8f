"""The demo: options, the launch under torchrun (``main``), one rank (``worker``), its console and report."""

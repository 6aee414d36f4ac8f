"""The command line: ``main`` dispatches ``python -m lifecycle COMMAND`` to a product."""

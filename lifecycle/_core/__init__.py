"""The core: states, table, ledger, plans, executor, session. No torch, megatron-core or NVRx.

Read bottom-up: ``states`` → ``table`` → ``errors`` → ``resources`` (one declaration
per resource kind) → ``ownership`` → ``plans`` → ``seams`` (the protocols the world
implements) → ``executor`` → ``signals`` → ``machine`` (the one ``transitions``
adapter) → ``session`` → ``wrapped`` (sessions under a restart wrapper) → ``records``
(the journal schema) → ``journal`` (writing and reading journals).
"""

"""The core: states, table, ledger, plans, executor, session. No torch, megatron-core or NVRx.

Read bottom-up: ``states`` → ``table`` → ``errors`` → ``resources`` (one declaration
per resource kind, each with its ``Handler``) → ``ownership`` → ``plans`` → ``holdings``
(the one owner of a session's ledger; leftovers derive from it in ``leftovers``) →
``seams`` (the protocols the world implements) → ``executor`` → ``worker`` (the threads a
teardown runs on while the caller waits) → ``signals`` → ``machine`` (the one ``transitions``
adapter) → ``events`` (the records observers get) → ``shield`` and ``frames`` (what a
teardown guards and clears) → ``acquiring`` (how a session acquires) and ``teardown``
(its plans run on a worker while the caller waits) → ``session`` → ``wrapped`` (sessions under a restart wrapper);
``processes`` reads /proc for the launchers. The journal a
session's run writes is the layer below, ``lifecycle.journal`` (a file format: records,
writer, reader), which the core does not need.
"""

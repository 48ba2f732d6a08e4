"""`feddg rehearse-network`: the consortium on separate network stacks of one machine (see ``command``).

One module per concern: ``options`` (the command's options and the drills' names, import-light), ``command`` (runs
a rehearsal), ``consortium`` (kits, network, shared state), ``small_job`` (its own job), ``processes`` (starting
participants, registrations, rounds, logs), ``drills/`` (one module per drill), ``outcomes`` (the drills' record),
``network`` (namespaces and links) and ``probe`` (the outsider's port probe).
"""

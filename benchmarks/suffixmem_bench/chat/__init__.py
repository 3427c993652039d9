"""``suffixmem bench chat``: multi-session, multi-turn chat against naive recompute and peers.

``run`` drives the configurations (``configs``, ``peers``), each in a child process
(``worker``) over one workload (``workload``); ``metrics`` defines the figures and ``report``
writes them. Import the modules directly; this package exports nothing of its own.
"""

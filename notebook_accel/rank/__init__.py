"""Inside a rank: what runs in a process (or device thread) the launcher started, around the user's function.

Imports only ``rank/``, ``wire/``, ``errors`` and ``formatting`` — never the planning, display or monitoring
code of the kernel — so a rank starts light (``tests/test_structure.py`` checks it). Entry points:
``process.rank_main`` (a process rank), ``xla.host.host_main`` (the TPU host), ``run.run_rank`` (every rank).
"""

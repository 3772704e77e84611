"""Kernel-side listeners on a launch's events: memory / CPU / GPU per rank (``resources.py``) and the log of
every reported metric (``metric_log.py``, ``Launch.metrics``)."""

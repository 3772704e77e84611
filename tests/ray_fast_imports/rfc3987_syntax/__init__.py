"""Left out of the fake Ray clusters' processes (``tests/ray_cluster.py`` puts this folder first on their path).

Every Ray process imports jsonschema (for runtime_env schemas), and jsonschema imports ``rfc3987_syntax`` when it is
installed (here, as a dependency of Jupyter's). Its import builds some thirty Earley parsers: seconds of CPU in every
Ray worker, GCS helper and dashboard agent — enough, on a loaded 2-core machine, for a raylet to give up on its agent
(it waits 15 s) and for every actor to take seconds more to start. jsonschema skips the module when it cannot be
imported; nothing the tests run checks RFC 3987 syntax.
"""
raise ImportError("rfc3987_syntax is left out of the tests' Ray processes (see tests/ray_fast_imports)")

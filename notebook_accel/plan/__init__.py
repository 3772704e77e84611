"""Before any process starts, in the kernel: every option checked and turned into a ``LaunchPlan`` (``plan.py``),
what devices are here (``devices.py``, ``tpu.py``), multi-node options (``nodes.py``) and saved defaults
(``config.py``). A bad option is a clear ``LaunchConfigError`` here, never a failure in a rank."""

"""How a launch ended: which failure is the root cause (``root_cause.py``), the exception the kernel raises
for it (``raising.py``), and out of memory recognised and explained (``oom.py``)."""

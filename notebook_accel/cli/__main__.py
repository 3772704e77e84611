"""``python -m notebook_accel.cli``: the ``notebook-accel`` command without installing its entry point."""
import sys

from . import main

sys.exit(main())

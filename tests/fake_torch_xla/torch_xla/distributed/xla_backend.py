"""Fake ``torch_xla.distributed.xla_backend``: importing it registers nothing here (no "xla" process group)."""

"""The only code both sides share: events, the channel that frames them over pipes, the payload (function and
arguments), pipe ends passed to a rank, and the allowed values that travel in env vars and events."""

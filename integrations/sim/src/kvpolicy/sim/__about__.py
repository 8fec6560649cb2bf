"""Version of kvpolicy-sim."""

__version__ = "0.1.0"

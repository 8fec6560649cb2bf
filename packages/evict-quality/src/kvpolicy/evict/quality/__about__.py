"""Version of kvpolicy-evict-quality."""

__version__ = "0.1.0"

"""Version of kvpolicy-admit."""

__version__ = "0.1.0"

"""Version of kvpolicy-evict."""

__version__ = "0.1.0"

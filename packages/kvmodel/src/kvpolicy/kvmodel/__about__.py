"""Version of kvpolicy-kvmodel."""

__version__ = "0.1.0"

"""Version of kvpolicy-kernels."""

__version__ = "0.1.0"

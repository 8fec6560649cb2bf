"""Version of kvpolicy-tenancy."""

__version__ = "0.1.0"

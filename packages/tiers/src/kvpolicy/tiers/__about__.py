"""Version of kvpolicy-tiers."""

__version__ = "0.1.0"

"""Version of kvpolicy-vllm."""

__version__ = "0.1.0"

"""``python -m kvpolicy.vllm.events ENDPOINT --budget B``: group TTLs for a live vLLM."""

from __future__ import annotations

import sys

from kvpolicy.vllm._events import _main

if __name__ == "__main__":
    sys.exit(_main())

"""A simulated LLM server with the OpenAI API: try a gateway, a load test or a client
without a GPU.

:class:`LiveEngine` runs the simulator's engine against the wall clock; :func:`create_app`
serves it over HTTP (``kvpolicy sim backend`` starts one). Latencies come from the same
phases and time model as ``kvpolicy sim``; the tokens are placeholders.
"""

from __future__ import annotations

from kvpolicy.sim.backend._app import count_prompt_tokens, create_app
from kvpolicy.sim.backend._events import KVEventPublisher
from kvpolicy.sim.backend._live import LiveEngine, RequestTooLongError

__all__ = [
    "KVEventPublisher",
    "LiveEngine",
    "RequestTooLongError",
    "count_prompt_tokens",
    "create_app",
]

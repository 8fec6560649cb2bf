"""Statistics of the public traces that calibrate the synthetic workloads.

Every constant below was computed from the files in ``../shared/traces`` (see each folder's
``PROVENANCE.md`` for the source repository, commit and licence) with this package's own
fitting code, and ``tests/test_workloads_calibration.py`` recomputes each of them from the
traces when they are present. Lengths are fitted by :meth:`LogNormalLengths.fit` (mean and
standard deviation of the logarithms, correlation of the logarithms, observed maxima);
arrivals by :meth:`GammaArrivals.fit` (rate ``1 / mean gap``, CV ``std / mean`` of the gaps).

========================  ======  =====  ==========  ==========  ======  ====================
trace                     rate/s  CV     ln prompt   ln output   corr    max prompt / output
========================  ======  =====  ==========  ==========  ======  ====================
Azure conv 2023 (19,366)  5.5301  1.094  6.633/0.985 5.019/0.859  0.087  14050 / 1000
Mooncake conv (12,031)    3.4012  3.034  8.737/1.199 5.336/1.358  0.051  126195 / 2000
ShareGPT 8k (30,731)      --      --     7.007/1.626 5.769/1.001  0.062  8141 / 1024
arXiv summ. (28,257)      --      --     7.717/0.755 5.187/0.796 -0.484  4054 / 4056
========================  ======  =====  ==========  ==========  ======  ====================

ServeGen ``language/m-small`` (43 clients, 14 days): the four largest clients and the other
39 pooled, by share of requests (``sum(rate * 600)`` over the 10-minute windows) and by
request-weighted mean of the per-window inter-arrival CV (:func:`servegen_client_stats`):

=====  ==========  =======
rank   share       CV
=====  ==========  =======
1      0.2988      3.097
2      0.2190      5.737
3      0.1072      1.487
4      0.0881      8.089
5-43   0.2869      1.842
=====  ==========  =======

Prefix reuse (Mooncake, the only trace with block hashes; 512-token blocks): every one of the
12,031 requests starts with the same block (a system prompt of at least 512 tokens), and
38.72% of requests reuse more than that block from an earlier request (a conversation's next
turn). :class:`PrefixSharing` with ``system_prompt_len=512``, ``follow_up_probability=0.3872``
and ``session_window=64`` (the one fitted parameter, chosen to match the hit ratio) gives an
unbounded-cache hit ratio of 0.367 on 16-token blocks for 12,031 mooncake-like requests
(seed 0), against 0.374 for the trace itself.

ShareGPT and arXiv have no timestamps. Their presets use Poisson arrivals at the rate that
offers the same prompt tokens per second as the Azure conversation trace
(``5.5301 * 1154.70 = 6385.6`` tokens/s): ``6385.6 / 2340.03 = 2.7289`` req/s for ShareGPT
(mean prompt 2340.03) and ``6385.6 / 2588.08 = 2.4673`` req/s for arXiv (mean prompt 2588.08).
"""

from __future__ import annotations

from kvpolicy.sim.workloads._arrivals import GammaArrivals
from kvpolicy.sim.workloads._lengthdist import LogNormalLengths
from kvpolicy.sim.workloads._prefix import PrefixSharing

__all__ = [
    "ARXIV_LENGTHS",
    "ARXIV_MEAN_PROMPT",
    "AZURE_CONV_ARRIVALS",
    "AZURE_CONV_LENGTHS",
    "AZURE_CONV_PROMPT_TOKENS_PER_S",
    "MOONCAKE_CONV_ARRIVALS",
    "MOONCAKE_CONV_LENGTHS",
    "MOONCAKE_CONV_PREFIX",
    "SERVEGEN_M_SMALL_TENANTS",
    "SHAREGPT_LENGTHS",
    "SHAREGPT_MEAN_PROMPT",
]

AZURE_CONV_ARRIVALS = GammaArrivals(rate=5.5301, cv=1.0942)
"""Azure LLM inference trace 2023, conversation service: 1 h, 19,366 requests."""
AZURE_CONV_LENGTHS = LogNormalLengths(
    prompt_mu=6.6333, prompt_sigma=0.9852, decode_mu=5.0190, decode_sigma=0.8590,
    correlation=0.0875, max_prompt_len=14050, max_decode_len=1000,
)  # fmt: skip
"""Prompt/output lengths of the Azure conversation trace."""
AZURE_CONV_PROMPT_TOKENS_PER_S = 5.5301 * 1154.70
"""Offered prompt tokens per second of the Azure conversation trace (mean prompt 1154.70)."""

MOONCAKE_CONV_ARRIVALS = GammaArrivals(rate=3.4012, cv=3.0337)
"""Mooncake (Kimi) FAST'25 conversation trace: 1 h, 12,031 requests, bursty."""
MOONCAKE_CONV_LENGTHS = LogNormalLengths(
    prompt_mu=8.7367, prompt_sigma=1.1991, decode_mu=5.3364, decode_sigma=1.3584,
    correlation=0.0511, max_prompt_len=126195, max_decode_len=2000,
)  # fmt: skip
"""Prompt/output lengths of the Mooncake conversation trace (long prompts)."""
MOONCAKE_CONV_PREFIX = PrefixSharing(
    system_prompt_len=512, follow_up_probability=0.3872, session_window=64, block_size=16
)
"""Prefix reuse of the Mooncake conversation trace: a shared system block, follow-up turns."""

SHAREGPT_LENGTHS = LogNormalLengths(
    prompt_mu=7.0065, prompt_sigma=1.6257, decode_mu=5.7694, decode_sigma=1.0011,
    correlation=0.0624, max_prompt_len=8141, max_decode_len=1024,
)  # fmt: skip
"""ShareGPT prompt/response lengths (Llama-2 tokenizer, filtered to 8k tokens)."""
SHAREGPT_MEAN_PROMPT = 2340.03
"""Mean prompt tokens of the ShareGPT file."""

ARXIV_LENGTHS = LogNormalLengths(
    prompt_mu=7.7166, prompt_sigma=0.7548, decode_mu=5.1867, decode_sigma=0.7956,
    correlation=-0.4841, max_prompt_len=4054, max_decode_len=4056,
)  # fmt: skip
"""arXiv summarisation prompt/response lengths: long prompts, short outputs."""
ARXIV_MEAN_PROMPT = 2588.08
"""Mean prompt tokens of the arXiv summarisation file."""

SERVEGEN_M_SMALL_TENANTS: tuple[tuple[float, float], ...] = (
    (0.2988, 3.097),
    (0.2190, 5.737),
    (0.1072, 1.487),
    (0.0881, 8.089),
    (0.2869, 1.842),
)
"""``(share, cv)`` of ServeGen m-small's four largest clients and of the 39 others pooled."""

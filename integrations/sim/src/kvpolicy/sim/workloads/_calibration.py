"""Statistics of the public traces that calibrate the synthetic workloads.

Every constant below was computed from the files in ``../shared/traces`` (see each folder's
``PROVENANCE.md`` for the source repository, commit and licence) with this package's own
fitting code, and ``tests/test_workloads_calibration.py`` recomputes each of them from the
traces when they are present. Arrivals are fitted by :meth:`GammaArrivals.fit` (rate
``1 / mean gap``, CV ``std / mean`` of the gaps).

Lengths come in two forms. The presets use :class:`QuantileLengths`: each marginal's
quantiles at :data:`QUANTILE_GRID` (27 probabilities, dense in the tail) and a Gaussian
copula with the Spearman rank correlation, which reproduce a trace's median, tail and mean
(``*_QUANTILES`` below; summary in the second table). The ``*_LENGTHS`` lognormals
(:meth:`LogNormalLengths.fit`: moments of the logarithms, their correlation, observed
maxima) are the parametric alternative; they match the log-moments but not the shape: on the
Azure conversation trace the lognormal puts the prompt median at 751 tokens and p99 at 7,775
against the trace's 1,020 and 4,142, so they are kept for sweeps over a parameter, not as
defaults.

========================  ======  =====  ==========  ==========  ======  ====================
trace                     rate/s  CV     ln prompt   ln output   corr    max prompt / output
========================  ======  =====  ==========  ==========  ======  ====================
Azure conv 2023 (19,366)  5.5301  1.094  6.633/0.985 5.019/0.859  0.087  14050 / 1000
Mooncake conv (12,031)    3.4012  3.034  8.737/1.199 5.336/1.358  0.051  126195 / 2000
ShareGPT 8k (30,731)      --      --     7.007/1.626 5.769/1.001  0.062  8141 / 1024
arXiv summ. (28,257)      --      --     7.717/0.755 5.187/0.796 -0.484  4054 / 4056
========================  ======  =====  ==========  ==========  ======  ====================

Quantile tables (tokens; correlation is the Gaussian copula's):

=============  ======================  ======================  =======
trace          prompt p50 / p99 / max  output p50 / p99 / max  copula
=============  ======================  ======================  =======
Azure conv     1020 / 4142 / 14050     129 / 601 / 1000        0.0762
Mooncake conv  6909 / 85400 / 126195   350 / 1119 / 2000       0.0751
ShareGPT 8k    1730 / 7434 / 8141      415 / 998 / 1024        0.0529
arXiv summ.    2730 / 3933 / 4054      167 / 3271 / 4056       -0.1191
=============  ======================  ======================  =======

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
unbounded-cache hit ratio of 0.370 on 16-token blocks for 12,031 mooncake-like requests
(seed 0), against 0.374 for the trace itself.

ShareGPT and arXiv have no timestamps. Their presets use Poisson arrivals at the rate that
offers the same prompt tokens per second as the Azure conversation trace
(``5.5301 * 1154.70 = 6385.6`` tokens/s): ``6385.6 / 2340.03 = 2.7289`` req/s for ShareGPT
(mean prompt 2340.03) and ``6385.6 / 2588.08 = 2.4673`` req/s for arXiv (mean prompt 2588.08).
"""

from __future__ import annotations

from kvpolicy.sim.workloads._arrivals import GammaArrivals
from kvpolicy.sim.workloads._lengthdist import LogNormalLengths, QuantileLengths
from kvpolicy.sim.workloads._prefix import PrefixSharing

__all__ = [
    "ARXIV_LENGTHS",
    "ARXIV_MEAN_PROMPT",
    "ARXIV_QUANTILES",
    "AZURE_CONV_ARRIVALS",
    "AZURE_CONV_LENGTHS",
    "AZURE_CONV_PROMPT_TOKENS_PER_S",
    "AZURE_CONV_QUANTILES",
    "MOONCAKE_CONV_ARRIVALS",
    "MOONCAKE_CONV_LENGTHS",
    "MOONCAKE_CONV_PREFIX",
    "MOONCAKE_CONV_QUANTILES",
    "SERVEGEN_M_SMALL_TENANTS",
    "SHAREGPT_LENGTHS",
    "SHAREGPT_MEAN_PROMPT",
    "SHAREGPT_QUANTILES",
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

AZURE_CONV_QUANTILES = QuantileLengths(
    prompt_quantiles=(
        2, 29, 120, 181, 207, 372, 387, 396, 403, 414, 703, 984, 1020, 1045, 1071, 1097,
        1130, 1189, 1315, 1876.2, 2734.5, 4083, 4092, 4142, 4831, 6179.1, 14050
    ),
    decode_quantiles=(
        7, 16, 28, 41, 54, 67, 77, 85, 91, 96, 103, 113, 129, 151, 177, 217, 384, 395,
        400, 411, 424, 451, 522, 601, 643.2, 954, 1000
    ),
    correlation=0.0762,
)  # fmt: skip
"""Quantile table of the Azure conversation trace (lengths of the Azure-based presets)."""
MOONCAKE_CONV_QUANTILES = QuantileLengths(
    prompt_quantiles=(
        891, 894, 896, 901, 964, 1261, 1662, 2306.5, 3263, 4251, 4993, 5870.5, 6909,
        8186.5, 9570, 11237.5, 13196, 15367, 17869, 21464, 27367, 39550.5, 58976.8,
        85400.4, 100810.3, 121300.9, 126195
    ),
    decode_quantiles=(
        1, 3, 3, 10, 24, 46, 100, 156.5, 213, 256, 291, 322.5, 350, 375, 399, 423, 447,
        472, 504, 543, 597, 698, 835.2, 1118.5, 1567.6, 2000, 2000
    ),
    correlation=0.0751,
)  # fmt: skip
"""Quantile table of the Mooncake conversation trace."""
SHAREGPT_QUANTILES = QuantileLengths(
    prompt_quantiles=(
        1, 12, 18, 29, 74, 180.5, 382, 580, 777, 973, 1203, 1457, 1730, 2060, 2401, 2799,
        3235, 3734.5, 4278, 4918, 5696, 6563, 7055.5, 7433.7, 7622, 7853.5, 8141
    ),
    decode_quantiles=(
        2, 6, 24, 44, 84, 130, 181, 228, 271, 312, 346, 381, 415, 453, 493, 534, 581, 628,
        683, 754, 834, 920, 965, 998, 1009.3, 1021, 1024
    ),
    correlation=0.0529,
)  # fmt: skip
"""Quantile table of the ShareGPT length file."""
ARXIV_QUANTILES = QuantileLengths(
    prompt_quantiles=(
        1, 73, 331, 748.6, 1242, 1564, 1802, 1986, 2150, 2308, 2453, 2596, 2730, 2861,
        2996, 3127, 3249, 3370, 3490, 3597, 3702, 3813, 3876, 3933.4, 3963, 4011.7, 4054
    ),
    decode_quantiles=(
        5, 36, 48, 60, 78, 92, 104, 115, 125, 135, 145, 156, 167, 179, 192, 206, 222, 242,
        268, 304, 372, 736.2, 2506.8, 3271.3, 3582.4, 3844.5, 4056
    ),
    correlation=-0.1191,
)  # fmt: skip
"""Quantile table of the arXiv summarisation length file."""

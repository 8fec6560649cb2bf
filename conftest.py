"""What every package's tests share: pytest reads this file for each package's tests, as it
sits above them all (the root ``pyproject.toml`` makes this folder the rootdir).

Hypothesis's timing checks are off: a test's deadline and the "input generation is slow"
health check judge the machine's load, not the code (a 2-core machine running every
package's tests side by side once took 58 s to draw one float). Speed is measured by the
benchmarks, never asserted in tests.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("kvpolicy", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvpolicy")

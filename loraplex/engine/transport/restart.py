"""How soon a dead engine process is started again: bounded exponential backoff.

The first restart waits ``initial_backoff_s``; every further attempt (a crash soon after the
engine came back, or a start that failed) doubles the wait up to ``max_backoff_s``; once an
engine has stayed up for ``healthy_reset_s`` its next crash starts again from
``initial_backoff_s``. A one-off crash costs half a second; a crash loop (a broken device, a
build that always fails) settles at one attempt every ``max_backoff_s`` instead of spinning.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_INITIAL_BACKOFF_S = 0.5
DEFAULT_MAX_BACKOFF_S = 30.0
DEFAULT_HEALTHY_RESET_S = 60.0


@dataclass(frozen=True)
class RestartPolicy:
    """When ``EngineProcess`` starts its child again after it died."""

    initial_backoff_s: float = DEFAULT_INITIAL_BACKOFF_S  # wait before the first restart
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S  # the doubling stops here
    healthy_reset_s: float = DEFAULT_HEALTHY_RESET_S  # up this long: the next wait is the first

    def __post_init__(self) -> None:
        for name in ("initial_backoff_s", "max_backoff_s", "healthy_reset_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(
                f"max_backoff_s {self.max_backoff_s} is invalid; expected >= initial_backoff_s "
                f"{self.initial_backoff_s}"
            )


class Backoff:
    """The wait before each start attempt (times are passed in: the policy is clock-free)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self._policy = policy
        self._next_s = policy.initial_backoff_s
        self._up_since_s: float | None = None  # when the current engine came up; None: down

    def up(self, now_s: float) -> None:
        """An engine came up (and answered) at ``now_s``."""
        self._up_since_s = now_s

    def next_delay_s(self, now_s: float) -> float:
        """The wait before the next attempt; call once per attempt."""
        up_since_s, self._up_since_s = self._up_since_s, None
        if up_since_s is not None and now_s - up_since_s >= self._policy.healthy_reset_s:
            self._next_s = self._policy.initial_backoff_s
        delay_s = self._next_s
        self._next_s = min(delay_s * 2, self._policy.max_backoff_s)
        return delay_s

"""Fault injection: what the engine's reliability tests run the reference service with.

A :class:`FaultSpec` is parsed from the ``--faults`` text, e.g.
``500=0.05,429=0.02:0.1s,drop=0.01,ambiguous=0.02,latency=0.05:2s,seed=7``:

* ``5xx=P``          answer HTTP 5xx (any code 500-599) with probability P, before the handler;
* ``429=P[:D]``      answer 429 with ``Retry-After: D`` (default 0.1 s), before the handler;
* ``drop=P``         close the connection without an answer, before the handler (not applied);
* ``ambiguous=P``    writes only (POST/PUT): run the handler fully, then close the connection
                     without sending its answer (applied, but the client cannot know);
* ``latency=P:D``    sleep D before handling (independent of the other faults);
* ``seed=N``         seed of the fault dice, for reproducible tests.

Durations are ``2s``, ``150ms`` or plain seconds.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

__all__ = ["Fault", "FaultDice", "FaultSpec", "parse_duration"]

DEFAULT_RETRY_AFTER = 0.1


class Fault(enum.Enum):
    """What the dice chose for one request."""

    NONE = "none"
    ERROR = "error"
    RATE_LIMITED = "429"
    DROP = "drop"
    AMBIGUOUS = "ambiguous"


def parse_duration(text: str) -> float:
    """``2s`` / ``150ms`` / ``0.5`` -> seconds."""
    value = text.strip().lower()
    try:
        if value.endswith("ms"):
            seconds = float(value[:-2]) / 1000.0
        elif value.endswith("s"):
            seconds = float(value[:-1])
        else:
            seconds = float(value)
    except ValueError:
        raise ValueError(f"invalid duration {text!r} (expected e.g. 2s, 150ms, 0.5)") from None
    if seconds < 0:
        raise ValueError(f"duration must not be negative: {text!r}")
    return seconds


def _probability(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"fault {name}: probability {text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"fault {name}: probability {value} is not between 0 and 1")
    return value


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """Fault probabilities. Build with :meth:`parse` or directly with keywords."""

    server_errors: tuple[tuple[int, float], ...] = ()
    rate_limited: float = 0.0
    retry_after: float = DEFAULT_RETRY_AFTER
    drop: float = 0.0
    ambiguous: float = 0.0
    latency: float = 0.0
    latency_seconds: float = 0.0
    seed: int | None = None
    _total: float = field(init=False, default=0.0, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = sum(p for _, p in self.server_errors) + self.rate_limited + self.drop
        total += self.ambiguous
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities add up to {total:.3f} > 1")
        for code, _ in self.server_errors:
            if not 500 <= code <= 599:
                raise ValueError(f"fault code {code} is not a 5xx status")
        object.__setattr__(self, "_total", total)

    @classmethod
    def parse(cls, text: str, *, seed: int | None = None) -> FaultSpec:
        """Parse the ``--faults`` text. ``seed`` (if given) wins over a ``seed=`` item."""
        errors: list[tuple[int, float]] = []
        kwargs: dict[str, float | int | None] = {}
        for raw in text.split(","):
            item = raw.strip()
            if not item:
                continue
            name, sep, value = item.partition("=")
            name = name.strip().lower()
            if not sep:
                raise ValueError(f"fault item {item!r} is not NAME=VALUE")
            prob_text, _, extra = value.partition(":")
            if extra and ((name.isdigit() and name != "429") or name in ("drop", "ambiguous")):
                raise ValueError(
                    f"fault {name} takes no duration ({item!r}): only 429=P:RETRY_AFTER and"
                    " latency=P:DURATION do"
                )
            if name.isdigit():
                code = int(name)
                if code == 429:
                    kwargs["rate_limited"] = _probability(name, prob_text)
                    if extra:
                        kwargs["retry_after"] = parse_duration(extra)
                else:
                    errors.append((code, _probability(name, prob_text)))
            elif name in ("drop", "ambiguous"):
                kwargs[name] = _probability(name, prob_text)
            elif name == "latency":
                kwargs["latency"] = _probability(name, prob_text)
                if not extra:
                    raise ValueError("fault latency needs a duration, e.g. latency=0.05:2s")
                kwargs["latency_seconds"] = parse_duration(extra)
            elif name == "seed":
                try:
                    kwargs["seed"] = int(value)
                except ValueError:
                    raise ValueError(f"fault seed {value!r} is not an integer") from None
            else:
                raise ValueError(
                    f"unknown fault {name!r} (known: 5xx codes, 429, drop, ambiguous, latency, "
                    "seed)"
                )
        if seed is not None:
            kwargs["seed"] = seed
        return cls(server_errors=tuple(errors), **kwargs)  # type: ignore[arg-type]

    @property
    def active(self) -> bool:
        """True when any fault can happen."""
        return self._total > 0.0 or (self.latency > 0.0 and self.latency_seconds > 0.0)

    def dice(self) -> FaultDice:
        """A fresh, seeded roller for one service instance."""
        return FaultDice(self)


class FaultDice:
    """Rolls the faults of one request. Deterministic for a given seed and request order."""

    __slots__ = ("_random", "spec")

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self._random = random.Random(spec.seed)

    def latency(self) -> float:
        """Seconds to stall this request (0 for none)."""
        spec = self.spec
        if spec.latency > 0.0 and self._random.random() < spec.latency:
            return spec.latency_seconds
        return 0.0

    def roll(self, *, is_write: bool) -> tuple[Fault, int]:
        """The fault for one request, and the 5xx status when it is :attr:`Fault.ERROR`."""
        spec = self.spec
        point = self._random.random()
        for code, p in spec.server_errors:
            if point < p:
                return Fault.ERROR, code
            point -= p
        if point < spec.rate_limited:
            return Fault.RATE_LIMITED, 429
        point -= spec.rate_limited
        if point < spec.drop:
            return Fault.DROP, 0
        point -= spec.drop
        if point < spec.ambiguous:
            return (Fault.AMBIGUOUS, 0) if is_write else (Fault.NONE, 0)
        return Fault.NONE, 0

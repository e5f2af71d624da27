"""The KVStore's reduction plans: what one push records, one bucketer per
launch signature (which keys, in which order), kept for reuse, and key
checking (Note [kvstore] in ``kvstore.py``)."""

from __future__ import annotations

import collections
from typing import Any, Callable, List, NamedTuple, Tuple, Union

import numpy as np

from ..ddp.bucket import GradientBucketer

__all__ = ["Key", "Push", "Plan", "Plans", "check_key"]

Key = Union[int, str]
MAX_CACHED_PLANS = 64


class Push(NamedTuple):
    """A push waiting for the next launch."""

    key: Key
    value: np.ndarray
    priority: int
    seq: int


class Plan:
    """A bucketer for one launch signature, and which key each parameter is.

    Args:
        keys: the keys, in the bucketer's parameter order.
        values: their values (the bucketer's parameters).
        bucket_cap_mb, first_bucket_mb: the store's bucket sizes.
        executor: the communication thread the buckets are reduced on.
        apply: ``apply(plan, bucket)`` after each bucket is reduced.
    """

    def __init__(self, keys: List[Key], values: List[np.ndarray], bucket_cap_mb: float,
                 first_bucket_mb: Any, executor: Any,
                 apply: Callable[["Plan", int], None]) -> None:
        self.keys = keys
        self.bucketer = GradientBucketer(values, bucket_cap_mb=bucket_cap_mb,
                                         first_bucket_mb=first_bucket_mb, average=False,
                                         executor=executor, on_reduced=lambda b: apply(self, b))
        self.active = False


class Plans:
    """The plans by launch signature, the most recently used last; at most
    ``MAX_CACHED_PLANS`` (an inactive plan is dropped first)."""

    def __init__(self) -> None:
        self._plans: "collections.OrderedDict[tuple, Plan]" = collections.OrderedDict()

    def get(self, signature: tuple, make: Callable[[], Plan]) -> Tuple[Plan, bool]:
        """The plan of ``signature`` (``make()`` if none), and whether it
        was made now."""
        plan = self._plans.get(signature)
        if plan is not None:
            self._plans.move_to_end(signature)
            return plan, False
        plan = self._plans[signature] = make()
        self._evict()
        return plan, True

    def all(self) -> List[Plan]:
        return list(self._plans.values())

    def _evict(self) -> None:
        while len(self._plans) > MAX_CACHED_PLANS:
            for signature, plan in self._plans.items():
                if not plan.active:
                    del self._plans[signature]
                    plan.bucketer.close()
                    break
            else:
                return

    def __len__(self) -> int:
        return len(self._plans)


def check_key(key: Any) -> Key:
    """``key`` as a store key (an int or a str).

    Raises:
        TypeError: any other type (bools included).
    """
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"key {key!r}: keys are ints or strings")
    if isinstance(key, (int, np.integer)):
        return int(key)
    if isinstance(key, str):
        return key
    raise TypeError(f"key {key!r} is a {type(key).__name__}: keys are ints or strings")

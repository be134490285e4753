"""apportion_arrays returns exactly what apportion returns (or raises the same error) on random
claims: bounds, zero and tiny targets, totals inside and outside the reachable range."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slotshift.apportion import ApportionError, Claim, apportion, apportion_arrays

_TARGETS = st.sampled_from([0.0, 1.0, 1e-3]) | st.floats(0, 50) | st.just(-1.0)


@st.composite
def _claims(draw: st.DrawFn) -> list[Claim]:
    claims = []
    for _ in range(draw(st.integers(0, 14))):
        lower = draw(st.integers(-1, 6))
        claims.append(Claim(lower, lower + draw(st.integers(-1, 9)), draw(_TARGETS)))
    return claims


@given(claims=_claims(), total=st.integers(-1, 90))
@settings(max_examples=3_000, deadline=None)
def test_apportion_arrays_equals_apportion(claims: list[Claim], total: int) -> None:
    try:
        expected: object = apportion(total, claims)
    except ApportionError as exc:
        expected = str(exc)
    try:
        got: object = apportion_arrays(
            total,
            np.array([c.lower for c in claims], dtype=np.int64),
            np.array([c.upper for c in claims], dtype=np.int64),
            np.array([c.target for c in claims], dtype=np.float64),
        ).tolist()
    except ApportionError as exc:
        got = str(exc)
    assert got == expected

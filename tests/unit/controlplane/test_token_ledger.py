"""TokenLedger: a pool's tokens per tenant from its gateways' full reports, summed over the
gateways counted now, with rates from each gateway's two newest reports."""

from __future__ import annotations

import pytest

from controlplane.token_ledger import TokenCount, TokenLedger, TokenRate


def _counts(*rows: tuple[str, str, int, int]) -> list[TokenCount]:
    return [TokenCount(*row) for row in rows]


def test_totals_sum_models_and_gateways_and_rates_need_two_reports() -> None:
    ledger = TokenLedger()
    ledger.record("gw-0", _counts(("A", "m", 100, 10), ("A", "alias-free", 50, 5)), now_s=0.0)
    ledger.record("gw-1", _counts(("A", "m", 1, 1), ("B", "m", 7, 3)), now_s=0.0)
    assert ledger.rates() == {
        "A": TokenRate(151, 16, 0.0, 0.0),
        "B": TokenRate(7, 3, 0.0, 0.0),
    }
    ledger.record("gw-0", _counts(("A", "m", 200, 30), ("A", "alias-free", 50, 5)), now_s=5.0)
    ledger.record("gw-1", _counts(("A", "m", 11, 6), ("B", "m", 7, 3)), now_s=2.0)
    rates = ledger.rates()
    a = rates["A"]
    assert (a.prompt_tokens_total, a.completion_tokens_total) == (261, 41)
    assert (a.prompt_tokens_per_s, a.completion_tokens_per_s) == pytest.approx(
        (100 / 5 + 10 / 2, 20 / 5 + 5 / 2)
    )
    assert rates["B"] == TokenRate(7, 3, 0.0, 0.0)


def test_a_counter_that_fell_is_a_restarted_gateway_counting_anew() -> None:
    ledger = TokenLedger()
    ledger.record("gw-0", _counts(("A", "m", 1000, 500)), now_s=0.0)
    ledger.record("gw-0", _counts(("A", "m", 40, 20)), now_s=4.0)
    assert ledger.rates()["A"] == TokenRate(40, 20, 10.0, 5.0)


def test_a_tenant_new_in_a_report_counts_from_zero() -> None:
    ledger = TokenLedger()
    ledger.record("gw-0", [], now_s=0.0)
    ledger.record("gw-0", _counts(("C", "m", 8, 4)), now_s=2.0)
    assert ledger.rates()["C"] == TokenRate(8, 4, 4.0, 2.0)


def test_two_reports_at_one_instant_keep_the_rate_they_had() -> None:
    ledger = TokenLedger()
    ledger.record("gw-0", _counts(("A", "m", 0, 0)), now_s=0.0)
    ledger.record("gw-0", _counts(("A", "m", 10, 10)), now_s=1.0)
    ledger.record("gw-0", _counts(("A", "m", 12, 12)), now_s=1.0)
    assert ledger.rates()["A"] == TokenRate(12, 12, 10.0, 10.0)


def test_a_forgotten_gateway_no_longer_counts() -> None:
    ledger = TokenLedger()
    ledger.record("gw-0", _counts(("A", "m", 5, 5)), now_s=0.0)
    ledger.record("gw-1", _counts(("A", "m", 1, 2)), now_s=0.0)
    ledger.forget("gw-0")
    ledger.forget("gw-unknown")
    assert ledger.rates() == {"A": TokenRate(1, 2, 0.0, 0.0)}

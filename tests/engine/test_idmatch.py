"""The sent id a changed id stands for (:mod:`fashiontag_pipeline.engine.idmatch`): pure."""

from __future__ import annotations

import pytest

from fashiontag_pipeline.engine.idmatch import MIN_PREFIX, IdMatcher, id_key


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (" sku 7\t", "sku 7"),
        ("sku  7", "sku 7"),
        ("cafe\u0301", "caf\u00e9"),
        ("Sku-7", "SKU-7"),
        ("007", 7),
        ("+7", "7"),
        ("-007", -7),
        ("000", 0),
        ("12345678901234567890123", 12345678901234567890123),
    ],
)
def test_ids_a_service_changes_have_one_key(a: str | int, b: str | int) -> None:
    assert id_key(a) == id_key(b)


@pytest.mark.parametrize(("a", "b"), [("p1", "p2"), ("7", "7.0"), ("-0", "-1"), ("a b", "ab")])
def test_other_ids_have_other_keys(a: str, b: str) -> None:
    assert id_key(a) != id_key(b)


def test_a_match_is_the_one_sent_id_it_stands_for() -> None:
    long = [f"{i:04d}-" + "x" * 40 for i in range(3)]
    matcher = IdMatcher({"sku-1", "007", "a1", "A1", *long})
    assert matcher.match("SKU-1") == "sku-1"
    assert matcher.match(7) == "007"
    assert matcher.match("a1") is None  # two sent ids stand for it: no match
    assert matcher.match("p9") is None
    assert matcher.match(long[1][:MIN_PREFIX]) == long[1]  # cut short
    assert matcher.match(long[1][: MIN_PREFIX - 1]) is None  # too short to be taken as cut
    assert matcher.match("0000-") is None  # a prefix of one long id, but too short
    # Which matches are of an id cut short (checked against the run's other ids).
    assert matcher.find(long[1][:MIN_PREFIX]) == (long[1], True)
    assert matcher.find("SKU-1") == ("sku-1", False)
    assert matcher.find("p9") == (None, False)
    # Cut by UTF-16 code units across an emoji: its first half, read as U+FFFD.
    emoji = "0001-" + "x" * 20 + "\U0001f600y"
    assert IdMatcher({emoji, "p9"}).find("0001-" + "x" * 20 + "\ufffd") == (emoji, True)


def test_a_prefix_shared_by_two_sent_ids_matches_neither() -> None:
    matcher = IdMatcher({"x" * 30 + "-1", "x" * 30 + "-2"})
    assert matcher.match("x" * 30) is None

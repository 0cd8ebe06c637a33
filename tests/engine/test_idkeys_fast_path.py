"""The coarse keys' fast path (:func:`~fashiontag_pipeline.engine.idkeys._own_keys`: ids that
are their own keys, told by one byte-table pass) against the general path it skips (fold,
URL-decode, drop whitespace, an integer's sign and zeros): on random ids drawn from the bytes
each step changes, the fast path says "own keys" only where the general path changes nothing,
and the keys are the same either way."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fashiontag_pipeline.engine.idkeys import _block, _general, _own_keys, coarse_keys, keyed

#: Bytes the general path changes or looks at, besides plain lower-case letters and digits:
#: every ASCII whitespace, upper case, percent escapes, signs, zeros, and a few non-ASCII
#: (full-width digit, zero-width space, Kelvin sign, no-break space).
_ALPHABET = "abcz0019-+%2AZK_. \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x01\x7f\uff10\u200b\u212a\xa0"

_ids = st.lists(st.text(_ALPHABET, max_size=6), min_size=1, max_size=8)
_plain = st.lists(st.text("abcxyz0123456789-_.:/", min_size=1, max_size=8), min_size=1)


@settings(max_examples=3000, deadline=None)
@given(_ids)
def test_the_fast_path_keys_ids_as_the_general_path_does(ids: list[str]) -> None:
    joined = "\x00" + "\x00".join(ids)
    general = _general(joined)
    if _own_keys(joined):
        assert general == joined, ids
    assert _block(ids) == (joined, general)
    assert coarse_keys(ids) == general[1:].split("\x00")
    assert keyed(ids) == set(general[1:].split("\x00"))


@settings(max_examples=500, deadline=None)
@given(_plain)
def test_catalogue_ids_take_the_fast_path_unless_one_starts_with_a_sign_or_zero(
    ids: list[str],
) -> None:
    joined = "\x00" + "\x00".join(ids)
    assert _own_keys(joined) == (not any(i[0] in "0-" for i in ids)), ids
    assert _general(joined) == joined or not _own_keys(joined)

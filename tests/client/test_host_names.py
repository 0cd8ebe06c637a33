""":func:`not_a_host_name` checks an ASCII host without ``xn--`` in Python, not by the IDNA
codec (importing it cost every start ~0.6 ms): its answers must be the codec's (and yarl's, as
aiohttp reads the host) for every host yarl gives as a URL's ``raw_host``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from fashiontag_pipeline._urls import not_a_host_name


def _by_the_codec(host: str) -> bool:
    """What the check answered before its ASCII path: the codec, then yarl's decoding."""
    try:
        host.encode("idna")
        URL.build(scheme="http", host=host, encoded=True).host  # noqa: B018
    except UnicodeError:
        return True
    return False


_PIECES = st.sampled_from(
    [*"abcxyzXN09-_.%~!$&'()*+,;=", "xn--", "XN--", "a" * 62, "b" * 63, "c" * 64]
)
_LABELS = st.lists(_PIECES, max_size=8).map("".join) | st.integers(0, 70).map("a".__mul__)
_HOSTS = st.lists(_LABELS, max_size=5).map(".".join) | st.text(
    st.characters(max_codepoint=127), max_size=80
)


@settings(max_examples=1000, deadline=None)
@given(_HOSTS, st.booleans())
def test_an_ascii_host_gets_the_codecs_answer(text: str, trailing_dot: bool) -> None:
    try:
        host = URL(f"http://{text}{'.' if trailing_dot else ''}/").raw_host
    except (ValueError, TypeError):
        return  # (refused before the check: "is not a valid URL")
    if not host or " " in host:
        return  # (refused before the check: "has no host", "no valid host and port")
    assert not_a_host_name(host) == _by_the_codec(host), host

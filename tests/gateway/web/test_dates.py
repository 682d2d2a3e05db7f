"""The gateway's fast message-timestamp reader reads what jupyter_client's dateutil reading did."""

from __future__ import annotations

import itertools

import jupyter_client.jsonutil as jsonutil
import pytest
from dateutil.parser import parse as dateutil_parse
from jupyter_client.session import Session

from jupyter_notebookos.gateway.web import dates

FORMS = [
    f"2026-12-05T09:30:07{fraction}{offset}"
    for fraction, offset in itertools.product(
        ["", ".1", ".12", ".123", ".1234", ".12345", ".123456"],
        ["", "Z", "+00:00", "+01:00", "-05:30", "+0100", "-0530"],
    )
]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonutil, "_dateutil_parse", jsonutil._dateutil_parse)  # undone after the test
    assert dates.install()


@pytest.mark.parametrize("text", FORMS)
def test_every_form_jupyter_client_admits_is_read_as_dateutil_reads_it(installed: None, text: str) -> None:
    assert jsonutil.ISO8601_PAT.match(text)
    ours, theirs = jsonutil.parse_date(text), jsonutil._ensure_tzinfo(dateutil_parse(text))
    assert ours == theirs and ours.utcoffset() == theirs.utcoffset()
    assert jsonutil.date_default(ours) == jsonutil.date_default(theirs)  # what the client is sent back


def test_what_dateutil_refused_is_refused_and_other_strings_stay_strings(installed: None) -> None:
    with pytest.raises(ValueError):
        dateutil_parse("2026-13-05T09:30:07Z")
    with pytest.raises(ValueError):
        jsonutil.parse_date("2026-13-05T09:30:07Z")
    assert jsonutil.parse_date("not a date") == "not a date"


def test_a_message_survives_the_gateways_deserialize_and_json_round_trip(installed: None) -> None:
    session = Session(key=b"k")
    msg = session.msg("status", {"execution_state": "idle"})
    parts = session.serialize(msg)
    _, fed = session.feed_identities(parts[parts.index(b"<IDS|MSG>") :])
    back = session.deserialize(fed)
    assert back["header"]["date"] == msg["header"]["date"] and back["content"] == {"execution_state": "idle"}
    assert jsonutil.date_default(back["header"]["date"]) == jsonutil.date_default(msg["header"]["date"])
    assert jsonutil._dateutil_parse is dates.parse_iso8601

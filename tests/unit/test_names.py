from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinbox.core.errors import ConfigurationError
from kinbox.core.names import sql_identifier, topic_name


@pytest.mark.parametrize("name", ["kinbox", "_x", "a1_b2", "a" * 63])
def test_plain_identifiers_pass(name: str) -> None:
    assert sql_identifier(name, setting="schema") == name


@pytest.mark.parametrize("name", ["", "1abc", "Kinbox", "a-b", 'x"; DROP TABLE y; --', "a" * 64])
def test_other_identifiers_fail_with_setting_and_value(name: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        sql_identifier(name, setting="schema")
    assert "schema=" in str(err.value) and repr(name) in str(err.value)


@pytest.mark.parametrize("name", ["lesson-events", "a.b_c-D", "x" * 249])
def test_legal_topics_pass(name: str) -> None:
    assert topic_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "ü", "x" * 250])
def test_illegal_topics_fail(name: str) -> None:
    with pytest.raises(ConfigurationError, match="not a legal Kafka topic name"):
        topic_name(name)


@given(st.text(max_size=80))
def test_identifier_check_never_lets_a_quote_or_space_through(text: str) -> None:
    try:
        sql_identifier(text, setting="schema")
    except ConfigurationError:
        return
    assert text.isascii() and not set(text) & set(" \"'`;-.\\")

"""Sizes as people write them (``core.human.parse_bytes``): every unit, exactly, and what reports print
(``human_bytes``) reads back as what it stands for, within its rounding; megabits and other shapes refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segrep.core.errors import SegrepError
from segrep.core.human import SIZE_UNITS, human_bytes, human_rate, parse_bytes


@given(number=st.integers(min_value=0, max_value=10**12), unit=st.sampled_from(sorted(SIZE_UNITS)), gap=st.booleans())
def test_a_whole_number_of_any_unit(number: int, unit: str, gap: bool) -> None:
    assert parse_bytes(f"{number}{' ' if gap else ''}{unit}") == number * SIZE_UNITS[unit]


@given(n=st.integers(min_value=0, max_value=10**15))
def test_what_human_bytes_prints_reads_back_within_its_rounding(n: int) -> None:
    text = human_bytes(n)
    unit = text.split()[1]
    assert abs(parse_bytes(text) - n) <= SIZE_UNITS[unit] * 0.05 + 1, text


def test_fractions_are_whole_bytes_rounded_down() -> None:
    assert parse_bytes("1.5 GB") == 1_500_000_000 and parse_bytes("0.5 KiB") == 512 and parse_bytes("1.9B") == 1


@pytest.mark.parametrize("text", ["100Mb", "20mb", "5 PB", "1e6", "-5", "5 M", "MB", "", "1.2.3MB", "20 MB/s", "1_000"])
def test_other_shapes_are_refused_naming_the_text(text: str) -> None:
    with pytest.raises(SegrepError, match="is not a size") as caught:
        parse_bytes(text)
    assert repr(text) in str(caught.value)


def test_rates_print_per_second_or_unlimited() -> None:
    assert human_rate(None) == "unlimited" and human_rate(20_000_000) == "20.0 MB/s" and human_rate(512) == "512 B/s"

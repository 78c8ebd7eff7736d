"""Bad split requests (issue 11 item 7, the steps the split DAG and `segrep split` share): a partition id that is
not a positive 32-bit integer and a split key that is not exactly a value of the partition key's type are
refused with one error naming them, before anything is read or written; `segrep split` exits 2 with one line.

orders is split on o_orderkey (int64, partitions 1-4), events on tenant (string, partitions 5-6), and the
`readings` environment on a float64 key; in every case the catalog and every site are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segrep.catalog.models import MAX_PARTITION_ID
from segrep.core.errors import SegrepError
from segrep.split.run import begin_split
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import BACKENDS, ORDERS_YAML, Env, shared_env

FUNCTION_SCOPED = settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])

READINGS_YAML = """
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
  dr: {id: 2, uri: sites/dr}
tables:
  readings:
    columns: {sensor: float64, v: string}
    primary_key: [sensor]
    split_points: [10.5]
    leader: primary
    replicas: [dr]
"""


# Every test here proves it changed nothing (`unchanged`): one environment per backend and module.
@pytest.fixture(scope="module", params=BACKENDS)
def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from shared_env(request, tmp_path_factory, ORDERS_YAML)


@pytest.fixture(scope="module", params=BACKENDS)
def readings(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from shared_env(request, tmp_path_factory, READINGS_YAML)


# -- `segrep split` --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("partition", "named"),
    [
        # refused by the option itself: partitions.partition_id is a 32-bit INTEGER
        ("0", "PARTITION': 0 is not in the range"),
        (str(MAX_PARTITION_ID + 1), f"{MAX_PARTITION_ID + 1} is not in the range"),
        (str(2**62), f"{2**62} is not in the range"),
        (str(2**70), "PARTITION"),
        ("five", "PARTITION"),
    ],
)
def test_split_refuses_a_partition_id_out_of_range(shared: Env, partition: str, named: str) -> None:
    with unchanged(shared):
        assert_user_error(*cli(shared, "split", "events", partition, "--at", "b"), named)


@pytest.mark.parametrize(
    ("table", "key", "named"),
    [
        ("orders", "1.5", "'1.5'"),
        ("orders", "true", "'true'"),
        ("orders", "nan", "'nan'"),
        ("orders", "inf", "'inf'"),
        ("orders", str(2**70), "out of range"),
        ("orders", str(-(2**63) - 1), "out of range"),
        ("orders", "abc", "'abc'"),
        ("orders", "1e3", "'1e3'"),
        ("orders", "", "''"),
    ],
)
def test_split_refuses_a_key_that_is_not_exactly_an_int64(shared: Env, table: str, key: str, named: str) -> None:
    with unchanged(shared):
        assert_user_error(*cli(shared, "split", table, "1", f"--at={key}"), "split key", "o_orderkey", named)


def test_split_refuses_duplicate_keys(shared: Env) -> None:
    with unchanged(shared):
        assert_user_error(*cli(shared, "split", "events", "5", "--at", "b", "--at", "b"), "distinct")


@pytest.mark.parametrize("key", ["nan", "NaN", "inf", "-inf", "ten", ""])
def test_split_refuses_nan_and_infinity_for_a_float_key(readings: Env, key: str) -> None:
    partition = "1"  # readings [-inf, 10.5)
    with unchanged(readings):
        assert_user_error(*cli(readings, "split", "readings", partition, f"--at={key}"), "split key", "sensor")


# -- begin_split, the split DAG's start task ------------------------------------------------------------------


@pytest.mark.parametrize("partition", [0, -1, 2**31, 2**63, 2**70, True, 5.0, "5", None])
def test_begin_split_refuses_a_partition_id_before_the_catalog_sees_it(shared: Env, partition: Any) -> None:
    with unchanged(shared), pytest.raises(SegrepError, match=f"partition id {partition!r}|partition id {partition}"):
        begin_split(shared.catalog, "events", partition, ["b"])
    with unchanged(shared), pytest.raises(SegrepError, match="partition id"):
        begin_split(shared.catalog, "events", partition)  # resuming: the same check


@FUNCTION_SCOPED
@given(partition=st.integers(max_value=0) | st.integers(min_value=MAX_PARTITION_ID + 1, max_value=2**200))
def test_begin_split_refuses_every_integer_out_of_range(sqlite_env: Env, partition: int) -> None:
    with unchanged(sqlite_env), pytest.raises(SegrepError, match=f"partition id {partition} is out of range"):
        begin_split(sqlite_env.catalog, "events", partition, ["b"])


@pytest.mark.parametrize(
    ("key", "named"),
    [
        (True, "True"),  # was converted to 1 (inside partition 1): a split at key 1
        (1.5, "fractional"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (2**70, "out of range"),
        (None, "null"),
        ([5], "[5]"),
    ],
)
def test_begin_split_refuses_a_key_that_is_not_exactly_an_int64(shared: Env, key: Any, named: str) -> None:
    with unchanged(shared), pytest.raises(SegrepError) as raised:
        begin_split(shared.catalog, "orders", 1, [key])
    assert "o_orderkey" in str(raised.value) and named in str(raised.value), raised.value


@FUNCTION_SCOPED
@given(
    key=st.floats().filter(lambda f: not (math.isfinite(f) and f.is_integer()))
    | st.booleans()
    | st.integers(min_value=2**63)
    | st.integers(max_value=-(2**63) - 1)
)
def test_begin_split_refuses_every_non_int64_key(sqlite_env: Env, key: Any) -> None:
    with unchanged(sqlite_env), pytest.raises(SegrepError, match="o_orderkey"):
        begin_split(sqlite_env.catalog, "orders", 1, [key])


@pytest.mark.parametrize("key", [float("nan"), float("inf"), -float("inf"), "nan", True, None])
def test_begin_split_refuses_nan_and_infinity_for_a_float_key(readings: Env, key: Any) -> None:
    with unchanged(readings), pytest.raises(SegrepError, match=r"split key .* sensor"):
        begin_split(readings.catalog, "readings", 1, [key])


@pytest.mark.parametrize("split_keys", ["b", b"b", 5, {"b": 1}])
def test_begin_split_refuses_split_keys_that_are_not_a_list(shared: Env, split_keys: Any) -> None:
    with unchanged(shared), pytest.raises(SegrepError, match="split keys must be a list"):
        begin_split(shared.catalog, "events", 5, split_keys)

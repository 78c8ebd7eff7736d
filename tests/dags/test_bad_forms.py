"""Bad trigger forms, DAG by DAG (issue 11 item 7).

- A conf the form refuses (wrong type, out of range, not one of the choices) creates no run and runs no task,
  through ``dag.test`` and through ``trigger_dag`` (what ``airflow dags trigger -c`` and the REST API call).
- A conf with a key the form does not have: Airflow itself adds it as a Param without a schema. The plugin's
  request guard refuses such a trigger at the REST API (tests/dags/test_make_airflow_ui.py); a run made past
  it (``dag.test``, the CLI) fails at its first task, which names the unknown key and the form's keys, before
  it does anything.
- A conf the form takes but the task cannot (the bootstrap of a table at its own leader, a split key outside
  the partition) fails the first task naming the problem.
In every case the catalog and every file under the environment (sites, work directory) are unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segrep.catalog.models import MAX_PARTITION_ID
from segrep.core import keys
from segrep.core.errors import SegrepError
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.airflow import airflow_rows, events_batch, events_yaml, load_dag, made_nothing, ti_states
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli

POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0}
INT64 = (-(2**63), 2**63 - 1)

# (DAG, conf the form refuses, the Param the refusal names), grouped by DAG below.
REFUSED: dict[str, list[tuple[dict[str, Any], str]]] = {
    "segrep_replicate_events": [
        ({"target": "nowhere"}, "target"),
        ({"target": "primary"}, "target"),  # a site, but the table's leader: not a replica
        ({"target": 2}, "target"),
        ({"reoffer": "yes"}, "reoffer"),
        ({"reoffer": 1}, "reoffer"),
        ({"reoffer": None}, "reoffer"),
    ],
    "segrep_maintain_events": [
        ({"force": "true"}, "force"),
        ({"gc_dry_run": 1}, "gc_dry_run"),
        ({"gc_dry_run": None}, "gc_dry_run"),
    ],
    "segrep_verify_events": [
        ({"files": "yes"}, "files"),
        ({"max_bytes_per_second": -1}, "max_bytes_per_second"),
        ({"max_bytes_per_second": 2**41}, "max_bytes_per_second"),
        ({"max_bytes_per_second": "fast"}, "max_bytes_per_second"),
    ],
    "segrep_bootstrap": [
        ({"table": "nope"}, "table"),
        ({"table": "events", "site": "nowhere"}, "site"),
        ({"table": "events", "site": "primary"}, "site"),  # leads every table: never a site to bootstrap
        ({"mode": "force"}, "mode"),
        ({"table": ["events"]}, "table"),
    ],
    "segrep_split_events": [
        ({"partition": 0}, "partition"),
        ({"partition": -5}, "partition"),
        ({"partition": 2**70}, "partition"),  # reached SQLite as an OverflowError inside the task
        ({"partition": MAX_PARTITION_ID + 1}, "partition"),
        ({"partition": "5"}, "partition"),
        ({"partition": 5.5}, "partition"),
        ({"partition": True}, "partition"),
        ({"split_keys": "b"}, "split_keys"),
        ({"split_keys": [1]}, "split_keys"),  # the partition key (tenant) is a string
        ({"split_keys": ["b", "b"]}, "split_keys"),
        ({"split_keys": [None]}, "split_keys"),
        ({"async": "yes"}, "async"),
    ],
    "segrep_failover": [
        ({"timeout": "soon"}, "timeout"),  # a duration: 90s, 10m, 1h
        ({"timeout": "10 minutes"}, "timeout"),
        ({"site": ""}, "site"),  # the most advanced live replica is null, shown with that label
        ({"site": "nowhere"}, "site"),
        ({"action": "move"}, "action"),
    ],
    "segrep_split_orders": [
        ({"split_keys": [True]}, "split_keys"),  # o_orderkey is int64: true is not 1
        ({"split_keys": [1.5]}, "split_keys"),
        ({"split_keys": [2**70]}, "split_keys"),
        ({"split_keys": ["100"]}, "split_keys"),
    ],
}

# (DAG, its first task, a conf with a misspelled key, the key); every other key of the form keeps its default.
UNKNOWN_KEY = {
    "segrep_replicate_events": ("round", {"reofer": True}, "reofer"),
    "segrep_maintain_events": ("plan_compaction", {"gc_dryrun": True}, "gc_dryrun"),
    "segrep_verify_events": ("verify", {"file": False}, "file"),
    "segrep_bootstrap": ("bootstrap", {"table": "events", "site": "edge", "sites": "dr"}, "sites"),
    "segrep_split_events": ("start", {"partition": 5, "split_keys": ["a1"], "asynch": True}, "asynch"),
}
FORM_KEYS = {
    "segrep_replicate_events": ["reoffer", "target"],
    "segrep_maintain_events": ["force", "gc_dry_run"],
    "segrep_verify_events": ["files", "max_bytes_per_second"],
    "segrep_bootstrap": ["mode", "site", "table"],
    "segrep_split_events": ["async", "partition", "split_keys"],
}


def _with_data(segrep_env: Any) -> Any:
    """The events environment with rows at the leader and at every replica: a task that ran would change it."""
    env = segrep_env(POLICY)
    write_batch(env.catalog, "events", events_batch(list(range(0, 40)), "a"))
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    write_batch(env.catalog, "events", events_batch(list(range(20, 60)), "b"))  # not replicated yet
    return env


def _no_spark(*_a: Any, **_k: Any) -> None:
    raise AssertionError("no Spark application expected")


def _server_params(dag: Any) -> Any:
    """The DAG's Params as the API server holds them (the serialized DAG), which validates a trigger's conf."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).params


def _form_takes(params: Any, conf: dict[str, Any]) -> bool:
    """Whether a trigger with ``conf`` passes the form, exactly as ``create_dagrun`` checks it."""
    from airflow.exceptions import ParamValidationError

    try:
        params.deep_merge(conf).validate()
    except ParamValidationError:
        return False
    return True


@pytest.mark.parametrize("dag_id", sorted(REFUSED))
def test_the_form_refuses_wrong_types_and_values_before_any_run(segrep_env: Any, dag_id: str) -> None:
    import pendulum
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import ParamValidationError
    from airflow.utils.types import DagRunTriggeredByType

    env = _with_data(segrep_env)
    dag = load_dag(dag_id)
    runs_before = airflow_rows(dag_id)

    with unchanged(env):
        for conf, param in REFUSED[dag_id]:
            with pytest.raises(ParamValidationError, match=f"param {param}"):
                dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)
            with pytest.raises(ParamValidationError, match=f"param {param}"):
                trigger_dag(dag_id, conf=conf, triggered_by=DagRunTriggeredByType.CLI)

    assert made_nothing(runs_before, dag_id)  # no run was created, no task ran


@pytest.mark.parametrize("dag_id", sorted(UNKNOWN_KEY))
def test_an_unknown_key_fails_the_first_task_before_it_does_anything(
    segrep_env: Any, capsys: pytest.CaptureFixture[str], dag_id: str
) -> None:
    """Past the REST API's guard (dag.test, the CLI), Airflow 3.3 takes a key that is not a Param: the first
    task refuses it."""
    import pendulum

    env = _with_data(segrep_env)
    dag = load_dag(dag_id)
    first, conf, unknown = UNKNOWN_KEY[dag_id]
    assert sorted(dag.params) == FORM_KEYS[dag_id]
    capsys.readouterr()

    with unchanged(env):
        run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)

    states = ti_states(run)
    assert str(run.state) == "failed" and states[(first, -1)] == "failed", states
    assert not [task for task, state in states.items() if state == "success"], states
    out = capsys.readouterr()
    errors = [line for line in (out.out + out.err).splitlines() if "FormError: " in line]
    assert errors, "the first task did not fail with a FormError"
    message = errors[0].split("FormError: ", 1)[1]
    assert f"unknown form key(s) {unknown!r}" in message and ", ".join(FORM_KEYS[dag_id]) in message, message


def test_the_bootstrap_task_refuses_the_tables_own_leader_and_a_site_that_is_not_its_replica(
    segrep_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The form lists every site that replicates some table; the task refuses, before writing anything, a site
    that leads the chosen table (here primary: a replica of `audit` but the leader of `events`) or that is not
    one of its replicas (edge does not replicate `orders`)."""
    import pendulum
    import yaml

    doc = yaml.safe_load(events_yaml())
    doc["tables"]["audit"] = {
        "columns": {"k": "int64", "v": "string"},
        "primary_key": ["k"],
        "leader": "dr",
        "replicas": ["primary"],
    }
    env = segrep_env(yaml_text=yaml.safe_dump(doc, sort_keys=False))
    write_batch(env.catalog, "events", events_batch(list(range(0, 40)), "a"))
    dag = load_dag("segrep_bootstrap")
    assert dag.params.get_param("site").schema["enum"] == ["dr", "edge", "primary"]
    capsys.readouterr()

    for conf, named in [
        ({"table": "events", "site": "primary"}, "site primary is the leader of events"),
        ({"table": "orders", "site": "edge"}, "site edge is not a replica of orders"),
    ]:
        with unchanged(env):
            run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)
        states = ti_states(run)
        assert str(run.state) == "failed" and states[("bootstrap", -1)] == "failed", states
        assert states[("catch_up", -1)] == states[("report", -1)] == "upstream_failed"
        out = capsys.readouterr()
        assert named in out.out + out.err


def test_segrep_bootstrap_refuses_the_tables_own_leader(segrep_env: Any) -> None:
    """The same check without Airflow: one line naming the leader, not advice to make it a replica."""
    env = _with_data(segrep_env)
    with unchanged(env):
        assert_user_error(*cli(env, "bootstrap", "events", "primary"), "site primary is the leader of events")


def test_the_split_task_refuses_what_the_form_cannot_know(segrep_env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A partition the table does not have, a key outside the partition's range: the start task fails naming
    it, before the partition changes state."""
    import pendulum

    env = _with_data(segrep_env)
    dag = load_dag("segrep_split_events")
    capsys.readouterr()
    for conf, named in [
        # first: dag.test keeps a run's conf in the DAG's params (a later run would inherit partition 3)
        (
            {"split_keys": ["a1"]},
            "choose a partition of events to split; the live ones (id, key range, state): 5 [-inf",
        ),
        ({"partition": 3, "split_keys": ["a1"]}, "table events has no partition 3"),
        # ... and says which partitions are live, with their ranges (the form cannot: no catalog at parse time)
        ({"partition": 3, "split_keys": ["a1"]}, 'live partitions of events: 5 [-inf, "m") LIVE; 6 ["m", +inf) LIVE'),
        ({"partition": 5, "split_keys": ["zz"]}, "are not inside partition 5's range"),
        ({"partition": 5, "split_keys": []}, "partition 5 of events has no split"),
    ]:
        with unchanged(env):
            run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)
        states = ti_states(run)
        assert str(run.state) == "failed" and states[("start", -1)] == "failed", states
        out = capsys.readouterr()
        assert named in out.out + out.err, conf


# -- every Param's schema, for generated values (the server's own check, no database) --------------------------

FIXTURE_SETTINGS = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)


def _integral(value: Any, low: int, high: int) -> bool:
    """An integer of JSON (5 or 5.0, never true) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return False
    return low <= value <= high


@pytest.fixture
def server_forms(segrep_env: Any) -> dict[str, Any]:
    from tests.support.airflow import load_dagbag

    segrep_env(POLICY)
    bag = load_dagbag()
    return {dag_id: _server_params(dag) for dag_id, dag in bag.dags.items()}


def test_every_param_of_every_dag_has_a_schema_with_a_type(server_forms: dict[str, Any]) -> None:
    for dag_id, params in server_forms.items():
        for key, param in params.items():
            # a type, or (the yes/no switches of segrep_airflow.forms.flag) an enum of true and false
            has_type = bool(param.schema.get("type")) or param.schema.get("enum") == [True, False]
            assert has_type, f"{dag_id}: Param {key} has no type: {param.schema}"
            assert (param.description or "").strip(), f"{dag_id}: Param {key} has no description"
            assert _form_takes(params, {}), f"{dag_id}: the defaults do not pass the form"


@FIXTURE_SETTINGS
@given(value=JSON)
def test_boolean_params_take_only_booleans(server_forms: dict[str, Any], value: Any) -> None:
    for dag_id, key in [
        ("segrep_replicate_events", "reoffer"),
        ("segrep_maintain_events", "force"),
        ("segrep_maintain_events", "gc_dry_run"),
        ("segrep_split_events", "async"),
    ]:
        assert _form_takes(server_forms[dag_id], {key: value}) == isinstance(value, bool), (dag_id, key, value)


@FIXTURE_SETTINGS
@given(value=JSON | st.integers(min_value=-(2**80), max_value=2**80))
def test_the_split_partition_is_a_positive_32_bit_integer(server_forms: dict[str, Any], value: Any) -> None:
    expected = value is None or _integral(value, 1, MAX_PARTITION_ID)  # empty: the task lists the live ones
    assert _form_takes(server_forms["segrep_split_events"], {"partition": value}) == expected, value


@FIXTURE_SETTINGS
@given(value=JSON | st.integers(min_value=-(2**70), max_value=2**70))
def test_an_int64_split_key_passes_the_form_only_if_the_task_takes_it(server_forms: dict[str, Any], value: Any) -> None:
    """The form of orders (o_orderkey int64) takes a key exactly when ``keys.from_user`` converts it."""
    import pyarrow as pa

    taken = _form_takes(server_forms["segrep_split_orders"], {"split_keys": [value]})
    assert taken == _integral(value, *INT64), value
    if taken:
        assert keys.from_user(value, pa.int64(), "split key") == int(value)
    elif not isinstance(value, str):  # "5" is refused by the form (a JSON number is wanted), taken by the CLI
        with pytest.raises(SegrepError):
            keys.from_user(value, pa.int64(), "split key")

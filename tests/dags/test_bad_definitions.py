"""A definitions file with a bad table (issue 11 item 5, DAG side): the DagBag shows one import error, from
dags/segrep_definitions.py, naming that table and its problem, and every other table's DAGs load as before.
A definitions file that cannot be used at all is one import error too, not one per DAG file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.airflow import DAGS, events_yaml

GOOD_DAGS = {
    "segrep_bootstrap",
    "segrep_failover",
    "segrep_maintain_orders",
    "segrep_replicate_orders",
    "segrep_split_orders",
    "segrep_verify_orders",
    "segrep_watchdog",  # reads the definitions when it runs, not when it is parsed
    "segrep_example_fresh_replica",  # dags/examples: orders replicates to dr
}
DEFINITIONS_FILE = "segrep_definitions.py"

# (policy of table `events`, what the error must name) as issue 11 saw them break the DAG files or stall them.
BAD_POLICIES: list[tuple[dict[str, Any], str]] = [
    ({"schedule": "every hour"}, "every hour"),
    ({"schedule": "0m"}, "0m"),
    ({"schedule": "-5m"}, "-5m"),
    ({"schedule": "10x"}, "10x"),
    ({"schedule": "@fortnightly"}, "@fortnightly"),
    ({"schedule": "61 * * * *"}, "61 * * * *"),
    ({"schedule": "0 0 31 2 *"}, "0 0 31 2 *"),  # never fires
    ({"maintenance_schedule": "bogus"}, "bogus"),
    ({"verify_schedule": "0 0 30 2 *"}, "verify_schedule"),  # never fires
    ({"verify_spark_threshold_bytes": 0}, "verify_spark_threshold_bytes"),
    ({"retry_delay_s": 10**30}, "retry_delay_s"),
    ({"start_date": "2026-11-02", "end_date": "2026-11-01"}, "end_date"),
]


def _write(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "segrep.yaml"
    config.write_text(text)
    monkeypatch.setenv("SEGREP_CONFIG", str(config))
    monkeypatch.delenv("SEGREP_CATALOG_URL", raising=False)  # parsing needs no catalog
    return config


def _bag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@pytest.mark.parametrize(("policy", "named"), BAD_POLICIES, ids=[repr(p) for p, _ in BAD_POLICIES])
def test_one_bad_table_is_one_import_error_and_the_others_load(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: dict[str, Any], named: str
) -> None:
    _write(tmp_path, events_yaml(policy), monkeypatch)

    bag = _bag()

    assert [Path(f).name for f in bag.import_errors] == [DEFINITIONS_FILE], bag.import_errors
    error = next(iter(bag.import_errors.values()))
    message = error.strip().splitlines()[-1]  # the exception's line
    assert "table(s) events not built" in message and "table events" in message and named in message, message
    assert "orders" not in message.split(":", 1)[1].split("not built")[0]  # only the bad table is named
    assert set(bag.dag_ids) == GOOD_DAGS  # every DAG of orders (and the bootstrap DAG); none of events
    assert bag.dags["segrep_bootstrap"].params.get_param("table").schema["enum"] == ["orders"]


def test_a_good_file_has_no_import_error_and_every_table_has_its_dags(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(
        tmp_path,
        events_yaml({"schedule": "10m", "maintenance_schedule": "30 2 * * *", "verify_schedule": "1d"}),
        monkeypatch,
    )

    bag = _bag()

    assert bag.import_errors == {}
    assert set(bag.dag_ids) == GOOD_DAGS | {
        f"segrep_{kind}_events" for kind in ("maintain", "replicate", "split", "verify")
    }


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("sites: [", "not valid YAML"),
        (yaml.safe_dump({"sites": {}, "tables": {}}), "no sites"),
        ("data_dir: data\nsites:\n  a: {id: 1, uri: a}\n  b: {id: 1, uri: b}\n", "already used"),
    ],
    ids=["not-yaml", "no-sites", "duplicate-site-id"],
)
def test_an_unusable_definitions_file_is_one_import_error(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, named: str
) -> None:
    _write(tmp_path, text, monkeypatch)

    bag = _bag()

    assert [Path(f).name for f in bag.import_errors] == [DEFINITIONS_FILE], bag.import_errors
    error = next(iter(bag.import_errors.values()))
    assert named in error.strip().splitlines()[-1]
    # Only the watchdog, which reads no definitions at parse time: its runs fail with the file's error (and alert).
    assert bag.dag_ids == ["segrep_watchdog"]


def test_a_good_tables_run_succeeds_while_another_table_is_bad(segrep_env: Any) -> None:
    """Tasks read the definitions as the DAG files do: the bad table is left out, not every table's run failed."""
    import pendulum

    from segrep_airflow.common import segrep_context
    from tests.support.airflow import ti_states

    env = segrep_env({"schedule": "5m", "start_date": "2026-11-01"})
    env.config.write_text(events_yaml({"schedule": "every hour"}))  # events goes bad after apply
    dag = load_dag_with_errors("segrep_replicate_orders")

    run = dag.test(logical_date=pendulum.now("UTC"))

    assert str(run.state) == "success", ti_states(run)
    with segrep_context() as (defs, _catalog):
        assert sorted(defs.tables) == ["orders"] and "every hour" in defs.table_errors["events"]


def load_dag_with_errors(dag_id: str) -> Any:
    bag = _bag()
    assert [Path(f).name for f in bag.import_errors] == [DEFINITIONS_FILE]
    return bag.get_dag(dag_id)

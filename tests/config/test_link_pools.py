"""Airflow pools per link (issue 36, DESIGN section 17): the pools `segrep airflow-pools` prints for `airflow
pools import` (one per direction with max_concurrent_copies), the pool a table's copy task into a site takes,
and the definitions refused because two directions would share a pool."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from segrep.cli.main import main
from segrep.config.definitions import Definitions, load_definitions
from segrep.config.link_pools import copy_pool, link_pools, pools_json, sources_into
from tests.support.badinput import assert_user_error
from tests.support.env import LINKS_YAML, ORDERS_YAML

LINK_PD = "link primary <-> dr, max_concurrent_copies 4"


def pools_doc(links: list[dict[str, Any]], **events: Any) -> dict[str, Any]:
    """ORDERS_YAML with ``links`` and the table ``events`` changed by ``events``."""
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(ORDERS_YAML))
    doc["links"] = links
    doc["tables"]["events"].update(events)
    return doc


def write_defs(tmp_path: Path, doc: dict[str, Any] | str) -> Path:
    path = tmp_path / "pools.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def defs_of(tmp_path: Path, doc: dict[str, Any] | str) -> Definitions:
    return load_definitions(write_defs(tmp_path, doc))


def airflow_pools(config: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--config", str(config), "airflow-pools", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_one_pool_per_direction_with_a_copy_limit(tmp_path: Path) -> None:
    """LINKS_YAML: primary <-> dr (4 copies) gives a pool each way; dr -> edge has no copy limit: no pool."""
    defs = defs_of(tmp_path, LINKS_YAML)

    assert pools_json(defs) == {
        "segrep_link_dr_primary": {
            "slots": 4,
            "description": f"segrep: copy tasks from dr to primary ({LINK_PD})",
            "include_deferred": False,
        },
        "segrep_link_primary_dr": {
            "slots": 4,
            "description": f"segrep: copy tasks from primary to dr ({LINK_PD})",
            "include_deferred": False,
        },
    }
    assert pools_json(defs_of(tmp_path, ORDERS_YAML)) == {}  # no link: no pool


def test_the_command_prints_the_import_file_and_a_table(tmp_path: Path) -> None:
    config = write_defs(tmp_path, LINKS_YAML)

    code, out, err = airflow_pools(config, "--json")
    assert code == 0, err
    assert json.loads(out) == pools_json(load_definitions(config))
    code, out, err = airflow_pools(config)
    assert code == 0, err
    rows = [[cell.strip() for cell in line.split("  ") if cell.strip()] for line in out.splitlines()]
    assert rows == [
        ["pool", "slots", "copies", "link"],
        ["segrep_link_dr_primary", "4", "dr -> primary", "primary <-> dr"],
        ["segrep_link_primary_dr", "4", "primary -> dr", "primary <-> dr"],
    ]

    none = write_defs(tmp_path, ORDERS_YAML)
    code, out, _ = airflow_pools(none, "--json")
    assert code == 0 and json.loads(out) == {}
    code, out, _ = airflow_pools(none)
    assert code == 0 and "no pool (copy tasks use default_pool)" in out


def test_bad_definitions_are_one_line_and_exit_2(tmp_path: Path) -> None:
    doc = pools_doc([{"between": ["primary", "mars"], "max_bytes_per_second": "1MB", "max_concurrent_copies": 2}])
    code, out, err = airflow_pools(write_defs(tmp_path, doc), "--json")
    assert_user_error(code, out, err, "links[0]", "'mars' is not a defined site")
    assert out == ""


def test_directions_whose_pools_would_share_a_name_are_refused(tmp_path: Path) -> None:
    doc: dict[str, Any] = {
        "sites": {name: {"id": i, "uri": f"sites/{name}"} for i, name in enumerate(["a_b", "c", "a", "b_c"], 1)},
        "links": [
            {"from": "a_b", "to": "c", "max_bytes_per_second": "1MB"},
            {"from": "a", "to": "b_c", "max_bytes_per_second": "1MB"},
        ],
    }
    code, out, err = airflow_pools(write_defs(tmp_path, doc))
    assert_user_error(code, out, err, "links[1] (a -> b_c)", "a_b -> c", "segrep_link_a_b_c", "rename")


def test_a_copy_task_takes_the_pool_of_the_link_it_crosses(tmp_path: Path) -> None:
    """events: primary leads, dr and edge replicate. dr's copies cross primary -> dr; edge's cross
    primary -> edge, which has no pool; the leader's (after a failover) may come from dr or edge."""
    defs = defs_of(tmp_path, LINKS_YAML)
    events = defs.table("events")

    def pool(site: str) -> str | None:
        found = copy_pool(defs, events, site)
        return None if found is None else found.name

    assert sources_into(events, "dr") == ("primary",)
    assert sources_into(events, "primary") == ("dr", "edge")
    assert (pool("dr"), pool("edge"), pool("primary")) == ("segrep_link_primary_dr", None, "segrep_link_dr_primary")


def test_a_fed_replica_takes_its_feeders_link_and_several_links_the_tightest(tmp_path: Path) -> None:
    links = [
        {"between": ["primary", "dr"], "max_bytes_per_second": "1MB", "max_concurrent_copies": 3},
        {"from": "dr", "to": "edge", "max_bytes_per_second": "1MB", "max_concurrent_copies": 2},
        {"from": "primary", "to": "edge", "max_bytes_per_second": "1MB", "max_concurrent_copies": 1},
    ]
    fed = defs_of(tmp_path, pools_doc(links, replicas={"dr": {}, "edge": {"from": "dr"}}))
    found = copy_pool(fed, fed.table("events"), "edge")
    assert found is not None and (found.name, found.slots) == ("segrep_link_dr_edge", 2)  # not primary -> edge

    # active-active: every site's copies may come from every other site; the tightest link's pool holds them
    any_site = defs_of(tmp_path, pools_doc(links, writes="any_site"))
    found = copy_pool(any_site, any_site.table("events"), "edge")
    assert found is not None and (found.name, found.slots) == ("segrep_link_primary_edge", 1)
    assert [p.name for p in link_pools(any_site)] == [
        "segrep_link_dr_edge",
        "segrep_link_dr_primary",
        "segrep_link_primary_dr",
        "segrep_link_primary_edge",
    ]

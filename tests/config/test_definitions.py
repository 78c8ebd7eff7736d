"""Tests of segrep.config.definitions.load_definitions: valid files and every malformed case (DESIGN sections 3 and 10).

Every bad definitions file must fail with a ConfigError (a SegrepError, so the CLI prints one line and exits 2)
whose message names the file and the bad entry; a raw TypeError or ValueError is a bug.
"""

from __future__ import annotations

import copy
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from segrep.config.definitions import CONFIG_ENV, Definitions, Policy, load_definitions
from segrep.core import schema as sch
from segrep.core.errors import ConfigError, SegrepError
from segrep.core.schema_changes import version_fingerprint
from segrep.core.schema_versions import first_version

EXAMPLE = Path(__file__).resolve().parents[2] / "include" / "segrep.yaml"
BAD_NAMES = ["Orders", "1abc", "../etc", "a/b", "a.b", "", "a" * 64]


def base_doc() -> dict[str, Any]:
    """A small valid definitions document; tests mutate a fresh copy."""
    return copy.deepcopy(
        {
            "data_dir": "data",
            "sites": {"primary": {"id": 1, "uri": "sites/primary"}, "dr": {"id": 2, "uri": "sites/dr"}},
            "tables": {
                "orders": {
                    "columns": {
                        "o_orderkey": "int64",
                        "o_custkey": "int64",
                        "o_totalprice": "decimal(15,2)",
                        "o_orderdate": "date",
                        "o_comment": "string",
                    },
                    "primary_key": ["o_orderkey"],
                    "split_points": [100, 200],
                    "leader": "primary",
                    "replicas": ["dr"],
                }
            },
        }
    )


def table(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["tables"]["orders"]


def write_defs(directory: Path, doc: Any, name: str = "segrep.yaml") -> Path:
    """Write ``doc`` (a YAML-able value, or raw text when a str) as a definitions file; return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def load(tmp_path: Path, doc: Any) -> Definitions:
    return load_definitions(write_defs(tmp_path, doc))


def config_error(path: Path, *fragments: str) -> str:
    """Load ``path``, expect a ConfigError naming the file and every fragment; return the message."""
    with pytest.raises(ConfigError) as info:
        load_definitions(path)
    msg = str(info.value)
    assert str(path) in msg or str(path.resolve()) in msg, f"file not named in: {msg}"
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not named in: {msg}"
    return msg


def bad(tmp_path: Path, doc: Any, *fragments: str) -> str:
    return config_error(write_defs(tmp_path, doc), *fragments)


def write_parquet(path: Path, columns: dict[str, pa.Array]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def test_config_error_is_a_segrep_error() -> None:
    """The CLI catches SegrepError to print one line; ConfigError must be one."""
    assert issubclass(ConfigError, SegrepError)


# --------------------------------------------------------------------------------------------------------------
# Valid files
# --------------------------------------------------------------------------------------------------------------


def test_example_definitions_file_loads(tmp_path: Path) -> None:
    """The shipped example must always be valid (a copy, so relative paths resolve under tmp_path)."""
    path = tmp_path / "include" / "segrep.yaml"
    path.parent.mkdir()
    shutil.copy(EXAMPLE, path)
    defs = load_definitions(path)
    assert defs.path == path.resolve()
    assert defs.sites and defs.tables
    for t in defs.tables.values():
        assert set(t.sites) <= set(defs.sites)
        assert t.partition_key in t.primary_key
        assert len(t.fingerprint) == 16
    for s in defs.sites.values():
        assert Path(s.uri).is_absolute() or "://" in s.uri


def test_valid_file_parses_sites_tables_and_schema(tmp_path: Path) -> None:
    defs = load(tmp_path, base_doc())
    assert [(s.name, s.site_id) for s in defs.sites.values()] == [("primary", 1), ("dr", 2)]
    t = defs.table("orders")
    assert t.schema == pa.schema(
        [
            ("o_orderkey", pa.int64()),
            ("o_custkey", pa.int64()),
            ("o_totalprice", pa.decimal128(15, 2)),
            ("o_orderdate", pa.date32()),
            ("o_comment", pa.string()),
        ]
    )
    assert t.primary_key == ("o_orderkey",)
    assert t.split_points == (100, 200)
    assert t.leader == "primary"
    assert t.replicas == ("dr",)
    assert t.sites == ("primary", "dr")
    assert t.fingerprint == version_fingerprint(first_version(sch.schema_to_columns(t.schema)), ("o_orderkey",))


def test_defaults(tmp_path: Path) -> None:
    """Omitted optional entries take documented defaults: data_dir 'data', pk[0] partitions, no replicas."""
    doc = base_doc()
    del doc["data_dir"]
    t = table(doc)
    for key in ("split_points", "replicas"):
        del t[key]
    t["primary_key"] = "o_orderkey"  # a single name is accepted for a one-column key
    defs = load(tmp_path, doc)
    assert defs.data_dir == (tmp_path / "data").resolve()
    assert defs.catalog_url is None
    td = defs.table("orders")
    assert td.primary_key == ("o_orderkey",)
    assert td.partition_key == "o_orderkey"
    assert td.split_points == ()
    assert td.replicas == ()
    assert td.policy == Policy()


def test_relative_site_paths_resolve_under_data_dir_relative_to_the_file(tmp_path: Path, monkeypatch) -> None:
    """The same file must work from any working directory (DAG parse time runs elsewhere than the CLI)."""
    doc = base_doc()
    doc["data_dir"] = "../data"
    path = write_defs(tmp_path / "conf", doc)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for given in (path, Path("../conf/segrep.yaml")):
        defs = load_definitions(given)
        assert defs.data_dir == (tmp_path / "data").resolve()
        assert defs.site("primary").uri == str((tmp_path / "data" / "sites" / "primary").resolve())
        assert defs.site("dr").uri == str((tmp_path / "data" / "sites" / "dr").resolve())


def test_absolute_paths_and_uris(tmp_path: Path) -> None:
    """Absolute paths and file:// URIs become plain absolute paths; s3:// passes through untouched (other
    schemes are refused: tests/config/test_bad_definitions.py)."""
    doc = base_doc()
    doc["sites"] = {
        "a": {"id": 1, "uri": str(tmp_path / "abs")},
        "b": {"id": 2, "uri": f"file://{tmp_path}/via_uri"},
        "c": {"id": 3, "uri": "s3://bucket/prefix"},
        "d": {"id": 4, "uri": "S3://other-bucket"},
        "e": {"id": 5, "uri": "  padded  "},
    }
    table(doc)["leader"] = "a"
    table(doc)["replicas"] = ["b", "c", "d"]
    defs = load(tmp_path, doc)
    assert defs.site("a").uri == str((tmp_path / "abs").resolve())
    assert defs.site("b").uri == str((tmp_path / "via_uri").resolve())
    assert defs.site("c").uri == "s3://bucket/prefix"
    assert defs.site("d").uri == "S3://other-bucket"
    assert defs.site("e").uri == str((tmp_path / "data" / "padded").resolve())


def test_config_path_from_environment(tmp_path: Path, monkeypatch) -> None:
    path = write_defs(tmp_path, base_doc(), "other.yaml")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert load_definitions().path == path.resolve()


def test_schema_from_parquet_file_normalizes_types(tmp_path: Path) -> None:
    """schema_from reads only the schema, relative to the definitions file, and maps physical variants
    (string_view, large_string, ns timestamps...) onto the vocabulary so fingerprints agree with 'columns'."""
    write_parquet(
        tmp_path / "schemas" / "orders.parquet",
        {
            "o_orderkey": pa.array([1], pa.int64()),
            "o_custkey": pa.array([1], pa.int64()),
            "o_totalprice": pa.array([1], pa.decimal128(15, 2)),
            "o_orderdate": pa.array([date(2026, 1, 1)], pa.date32()),
            "o_comment": pa.array(["x"], pa.string_view()),
        },
    )
    write_parquet(
        tmp_path / "schemas" / "misc.parquet",
        {
            "k": pa.array([1], pa.int32()),
            "big": pa.array(["x"], pa.large_string()),
            "blob": pa.array([b"x"], pa.large_binary()),
            "ts": pa.array([0], pa.timestamp("ns")),
        },
    )
    assert pq.read_schema(tmp_path / "schemas" / "orders.parquet").field("o_comment").type == pa.string_view()
    doc = base_doc()
    expected_fingerprint = load(tmp_path, doc).table("orders").fingerprint
    t = table(doc)
    del t["columns"]
    t["schema_from"] = "schemas/orders.parquet"
    doc["tables"]["misc"] = {"schema_from": "schemas/misc.parquet", "primary_key": "k", "leader": "primary"}
    defs = load(tmp_path, doc)
    orders = defs.table("orders")
    assert orders.schema.field("o_comment").type == pa.string()
    assert orders.fingerprint == expected_fingerprint
    assert defs.table("misc").schema == pa.schema(
        [
            ("k", pa.int32()),
            ("big", pa.string()),
            ("blob", pa.binary()),
            ("ts", pa.timestamp("us", tz="UTC")),
        ]
    )
    assert orders.schema.metadata is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7d", 7 * 86400),
        ("12h", 12 * 3600),
        ("15m", 900),
        ("30s", 30),
        ("2w", 14 * 86400),
        ("3 h", 10800),
        (0, 0),
        (3600, 3600),
    ],
)
def test_policy_durations(tmp_path: Path, value: Any, seconds: int) -> None:
    doc = base_doc()
    table(doc)["policy"] = {"orphan_grace_s": value}
    policy = load(tmp_path, doc).table("orders").policy
    assert policy.orphan_grace_s == seconds
    if seconds <= 3600:  # retry_delay_s is at most an hour, where the back-off is capped
        table(doc)["policy"] = {"retry_delay_s": value}
        assert load(tmp_path, doc).table("orders").policy.retry_delay_s == seconds


def test_policy_full(tmp_path: Path) -> None:
    doc = base_doc()
    table(doc)["policy"] = {
        "schedule": "*/5 * * * *",
        "start_date": "2026-11-01",
        "max_incoming_segments": 4,
        "spark_copy_threshold_bytes": 1024,
        "retries": 1,
        "compact_min_segments": 2,
        "compact_min_bytes": 10,
        "tombstone_grace_s": "14d",
        "max_retention_s": "7d",
        "verify_schedule": " 15m ",
        "verify_spark_threshold_bytes": 1,
        "in_process_merge_max_rows": 0,
        "in_process_merge_max_bytes": 2048,
        "merge_engine": "spark",
    }
    p = load(tmp_path, doc).table("orders").policy
    assert p.schedule == "*/5 * * * *"
    assert p.start_date == date(2026, 11, 1)
    assert (p.max_incoming_segments, p.spark_copy_threshold_bytes, p.retries) == (4, 1024, 1)
    assert (p.compact_min_segments, p.compact_min_bytes) == (2, 10)
    assert (p.tombstone_grace_s, p.max_retention_s) == (14 * 86400, 7 * 86400)
    assert p.orphan_grace_s == Policy().orphan_grace_s
    assert (p.verify_schedule, p.verify_spark_threshold_bytes) == ("15m", 1)
    assert (p.in_process_merge_max_rows, p.in_process_merge_max_bytes, p.merge_engine) == (0, 2048, "spark")
    assert Policy().merge_engine == "auto"
    assert (Policy().verify_schedule, Policy().maintenance_schedule) == ("@daily", "@daily")


def test_policy_on_write(tmp_path: Path) -> None:
    """``schedule: on_write`` with ``min_interval`` (default 10 s); the fallback interval kept under it."""
    doc = base_doc()
    table(doc)["policy"] = {"schedule": "on_write"}
    p = load(tmp_path, doc).table("orders").policy
    assert (p.on_write, p.min_interval_s, p.write_fallback_s) == (True, 10, 300)
    table(doc)["policy"] = {"schedule": "on_write", "min_interval": "2m", "rpo": "30m"}
    p = load(tmp_path, doc).table("orders").policy
    assert (p.min_interval_s, p.write_fallback_s) == (120, 300)  # half the RPO is longer than 5 min
    table(doc)["policy"] = {"schedule": "on_write", "min_interval": 0, "rpo": "4m"}
    p = load(tmp_path, doc).table("orders").policy
    assert (p.min_interval_s, p.write_fallback_s) == (0, 120)  # half the RPO
    table(doc)["policy"] = {"schedule": "on_write", "min_interval": "1h", "rpo": "30s"}
    p = load(tmp_path, doc).table("orders").policy
    assert (p.min_interval_s, p.write_fallback_s) == (3600, 3600)  # never more often than min_interval
    table(doc)["policy"] = {"schedule": "on_write", "rpo": "30s"}
    assert load(tmp_path, doc).table("orders").policy.write_fallback_s == 60  # at least a minute
    assert not Policy().on_write and Policy().min_interval_s == 10


def test_policy_schedule_null_and_yaml_date(tmp_path: Path) -> None:
    """A null schedule means trigger-only; an unquoted YAML date arrives as a date object."""
    doc = base_doc()
    table(doc)["policy"] = {"schedule": None, "start_date": date(2026, 2, 3)}
    path = write_defs(tmp_path, doc)
    assert "start_date: 2026-02-03" in path.read_text()
    p = load_definitions(path).table("orders").policy
    assert p.schedule is None
    assert p.start_date == date(2026, 2, 3)


def test_equal_tombstone_grace_and_retention_is_allowed(tmp_path: Path) -> None:
    doc = base_doc()
    table(doc)["policy"] = {"tombstone_grace_s": "2d", "max_retention_s": 172800}
    p = load(tmp_path, doc).table("orders").policy
    assert p.tombstone_grace_s == p.max_retention_s == 172800


def test_split_points_are_cast_to_the_partition_key_type(tmp_path: Path) -> None:
    doc = base_doc()
    t = table(doc)
    t["primary_key"] = ["o_orderdate", "o_orderkey"]
    t["split_points"] = ["2026-01-01", "2026-06-01"]
    assert load(tmp_path, doc).table("orders").split_points == (date(2026, 1, 1), date(2026, 6, 1))


def test_longest_valid_name_is_accepted(tmp_path: Path) -> None:
    name = "a" * 63
    doc = base_doc()
    doc["sites"][name] = {"id": 3, "uri": "x"}
    doc["tables"][name] = {"columns": {name: "int64"}, "primary_key": name, "leader": name}
    defs = load(tmp_path, doc)
    assert defs.table(name).leader == name


# --------------------------------------------------------------------------------------------------------------
# Malformed files
# --------------------------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    config_error(tmp_path / "nope.yaml", "cannot read")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    config_error(tmp_path, "cannot read")


@pytest.mark.parametrize("text", ["sites: [unclosed", "a: b: c", "tables:\n  - x\n y: 1", "\t- tab"])
def test_not_yaml(tmp_path: Path, text: str) -> None:
    bad(tmp_path, text, "not valid YAML")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just a string\n", "42\n", "null\n"])
def test_not_a_mapping(tmp_path: Path, text: str) -> None:
    bad(tmp_path, text, "mapping")


@pytest.mark.parametrize(
    ("where", "typo"),
    [
        ("top", "site"),
        ("top", "catalog"),
        ("site", "url"),
        ("table", "primary_keys"),
        ("table", "replica"),
        ("policy", "schedul"),
        ("policy", "tombstone_grace"),
    ],
)
def test_unknown_keys_at_every_level(tmp_path: Path, where: str, typo: str) -> None:
    """A typo must not be silently ignored: the default it falls back to could drop data (e.g. retention)."""
    doc = base_doc()
    target = {
        "top": doc,
        "site": doc["sites"]["dr"],
        "table": table(doc),
        "policy": table(doc).setdefault("policy", {}),
    }[where]
    target[typo] = 1
    bad(tmp_path, doc, "unknown key", typo)


def test_unknown_keys_of_mixed_types_still_give_a_config_error(tmp_path: Path) -> None:
    """A non-string key next to a typo must not crash the sorting of the error message."""
    doc = base_doc()
    doc["sites"]["dr"][7] = "x"
    doc["sites"]["dr"]["urii"] = "y"
    bad(tmp_path, doc, "unknown key", "urii", "site dr")


@pytest.mark.parametrize("section", ["sites", "tables", "columns", "policy", "site", "table"])
def test_sections_that_are_not_mappings(tmp_path: Path, section: str) -> None:
    doc = base_doc()
    if section in ("sites", "tables"):
        doc[section] = ["primary"]
    elif section == "site":
        doc["sites"]["dr"] = "sites/dr"
    elif section == "table":
        doc["tables"]["orders"] = ["o_orderkey"]
    else:
        table(doc)[section] = ["x"]
    bad(tmp_path, doc, "mapping")


def test_no_sites(tmp_path: Path) -> None:
    doc = base_doc()
    doc["sites"] = {}
    bad(tmp_path, doc, "no sites")


def test_duplicate_site_ids(tmp_path: Path) -> None:
    doc = base_doc()
    doc["sites"]["dr"]["id"] = 1
    bad(tmp_path, doc, "site dr", "id 1", "primary")


@pytest.mark.parametrize("site_id", [0, -1, "1", 1.0, True, 2**31, None])
def test_bad_site_ids(tmp_path: Path, site_id: Any) -> None:
    doc = base_doc()
    doc["sites"]["dr"]["id"] = site_id
    bad(tmp_path, doc, "site dr", "'id'")


@pytest.mark.parametrize("uri", ["", "   ", None, 5])
def test_bad_site_uris(tmp_path: Path, uri: Any) -> None:
    doc = base_doc()
    doc["sites"]["dr"]["uri"] = uri
    bad(tmp_path, doc, "site dr", "'uri'")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_site_names(tmp_path: Path, name: str) -> None:
    doc = base_doc()
    doc["sites"][name] = {"id": 9, "uri": "x"}
    bad(tmp_path, doc, "site name", repr(name))


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_table_names(tmp_path: Path, name: str) -> None:
    doc = base_doc()
    doc["tables"][name] = doc["tables"].pop("orders")
    bad(tmp_path, doc, "table name", repr(name))


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_column_names(tmp_path: Path, name: str) -> None:
    doc = base_doc()
    table(doc)["columns"][name] = "int64"
    bad(tmp_path, doc, "column name", repr(name))


def test_name_with_trailing_newline_is_invalid(tmp_path: Path) -> None:
    """Names become path components: 'orders\\n' must be refused like any other non-[a-z0-9_] character."""
    doc = base_doc()
    doc["tables"]["orders\n"] = doc["tables"].pop("orders")
    bad(tmp_path, doc, "table name")


def test_non_string_names(tmp_path: Path) -> None:
    doc = base_doc()
    doc["tables"][123] = doc["tables"].pop("orders")
    bad(tmp_path, doc, "table name", "123")


@pytest.mark.parametrize("leader", ["nowhere", None, "Primary"])
def test_leader_not_a_defined_site(tmp_path: Path, leader: Any) -> None:
    doc = base_doc()
    table(doc)["leader"] = leader
    bad(tmp_path, doc, "table orders", "leader", repr(leader))


def test_leader_given_as_a_list(tmp_path: Path) -> None:
    """A plausible slip (leader: [primary]) must be a ConfigError, not a TypeError from hashing a list."""
    doc = base_doc()
    table(doc)["leader"] = ["primary"]
    bad(tmp_path, doc, "table orders", "leader")


def test_replica_not_a_defined_site(tmp_path: Path) -> None:
    doc = base_doc()
    table(doc)["replicas"] = ["dr", "nowhere"]
    bad(tmp_path, doc, "table orders", "replica", "'nowhere'")


def test_replica_equal_to_leader(tmp_path: Path) -> None:
    doc = base_doc()
    table(doc)["replicas"] = ["dr", "primary"]
    bad(tmp_path, doc, "table orders", "leader", "primary")


@pytest.mark.parametrize("replicas", ["dr", ["dr", "dr"], {"dr": 1}])
def test_replicas_not_a_list_of_distinct_sites(tmp_path: Path, replicas: Any) -> None:
    doc = base_doc()
    table(doc)["replicas"] = replicas
    bad(tmp_path, doc, "table orders", "replicas")


def test_replica_given_as_a_nested_list(tmp_path: Path) -> None:
    doc = base_doc()
    table(doc)["replicas"] = [["dr"]]
    bad(tmp_path, doc, "table orders", "replica")


def test_primary_key_column_not_in_columns(tmp_path: Path) -> None:
    doc = base_doc()
    table(doc)["primary_key"] = ["o_orderkey", "o_linenumber"]
    bad(tmp_path, doc, "table orders", "'o_linenumber'")


@pytest.mark.parametrize("pk", [[], None, ["o_orderkey", "o_orderkey"], [1], {"o_orderkey": 1}])
def test_malformed_primary_key(tmp_path: Path, pk: Any) -> None:
    doc = base_doc()
    table(doc)["primary_key"] = pk
    bad(tmp_path, doc, "table orders", "primary_key")


@pytest.mark.parametrize("part", ["o_custkey", "nope", ["o_orderkey"]])
def test_partition_key_not_in_primary_key(tmp_path: Path, part: Any) -> None:
    doc = base_doc()
    table(doc)["partition_key"] = part
    bad(tmp_path, doc, "table orders", "partition_key")


@pytest.mark.parametrize(
    ("points", "fragment"),
    [
        ([200, 100], "ascending"),
        ([100, 100], "ascending"),
        ([100, None], "split_points[1] None is not a valid int64 key: a key cannot be null"),
        (["abc"], "split_points[0] 'abc' is not a valid int64 key: not an integer"),
        ([1.5], "split_points[0] 1.5 is not a valid int64 key: has a fractional part"),
        ([1, "a"], "split_points[1] 'a'"),
        ("100", "list"),
        ({"a": 1}, "list"),
    ],
)
def test_bad_split_points(tmp_path: Path, points: Any, fragment: str) -> None:
    doc = base_doc()
    table(doc)["split_points"] = points
    bad(tmp_path, doc, "table orders", "split_points", fragment)


@pytest.mark.parametrize("type_", ["int65", "varchar", "uint64", "decimal(0,0)", "decimal(39,2)", "decimal(5,6)", 5])
def test_unknown_column_type(tmp_path: Path, type_: Any) -> None:
    doc = base_doc()
    table(doc)["columns"]["o_comment"] = type_
    bad(tmp_path, doc, repr(type_))


def test_unknown_column_type_names_the_table_and_column(tmp_path: Path) -> None:
    """With many tables, 'unknown column type int65' alone does not say where to look."""
    doc = base_doc()
    table(doc)["columns"]["o_comment"] = "int65"
    bad(tmp_path, doc, "orders", "o_comment", "'int65'")


@pytest.mark.parametrize(
    "policy",
    [
        {"tombstone_grace_s": "1d"},
        {"max_retention_s": "14d"},
        {"tombstone_grace_s": 3600, "max_retention_s": 3601},
    ],
)
def test_tombstone_grace_shorter_than_retention(tmp_path: Path, policy: dict[str, Any]) -> None:
    """Shorter grace would let a replica away for the whole retention resurrect deleted rows (DESIGN 7)."""
    doc = base_doc()
    table(doc)["policy"] = policy
    bad(tmp_path, doc, "table orders policy", "tombstone_grace_s", "max_retention_s")


@pytest.mark.parametrize("value", ["7x", "-1", -5, 1.5, True, "d", "", "7dd", None, ["7d"]])
def test_bad_durations(tmp_path: Path, value: Any) -> None:
    doc = base_doc()
    table(doc)["policy"] = {"orphan_grace_s": value}
    bad(tmp_path, doc, "table orders policy", "orphan_grace_s")


@pytest.mark.parametrize("value", [0, -1, "8", True, 1.5, None])
def test_bad_policy_integers(tmp_path: Path, value: Any) -> None:
    doc = base_doc()
    table(doc)["policy"] = {"max_incoming_segments": value}
    bad(tmp_path, doc, "table orders policy", "max_incoming_segments")


@pytest.mark.parametrize(("key", "value"), [("schedule", ""), ("schedule", 5), ("start_date", "tomorrow")])
def test_bad_schedule_and_start_date(tmp_path: Path, key: str, value: Any) -> None:
    doc = base_doc()
    table(doc)["policy"] = {key: value}
    bad(tmp_path, doc, "table orders policy", key)


def test_catalog_url_not_a_string(tmp_path: Path) -> None:
    doc = base_doc()
    doc["catalog_url"] = 5
    bad(tmp_path, doc, "catalog_url")


def test_both_columns_and_schema_from(tmp_path: Path) -> None:
    write_parquet(tmp_path / "s.parquet", {"o_orderkey": pa.array([1])})
    doc = base_doc()
    table(doc)["schema_from"] = "s.parquet"
    bad(tmp_path, doc, "table orders", "'columns'", "'schema_from'")


def test_neither_columns_nor_schema_from(tmp_path: Path) -> None:
    doc = base_doc()
    del table(doc)["columns"]
    bad(tmp_path, doc, "table orders", "'columns'", "'schema_from'")


def test_empty_columns(tmp_path: Path) -> None:
    doc = base_doc()
    table(doc)["columns"] = {}
    bad(tmp_path, doc, "table orders", "no columns")


def schema_from_doc(source: str) -> dict[str, Any]:
    doc = base_doc()
    t = table(doc)
    del t["columns"]
    del t["split_points"]
    t["schema_from"] = source
    return doc


@pytest.mark.parametrize("kind", ["missing", "not_parquet", "directory", "empty"])
def test_unreadable_schema_from(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "schema.parquet"
    if kind == "not_parquet":
        target.write_text("o_orderkey,int64\n")
    elif kind == "directory":
        target.mkdir()
    elif kind == "empty":
        target.write_bytes(b"")
    bad(tmp_path, schema_from_doc("schema.parquet"), "table orders", "schema_from", str(target))


@pytest.mark.parametrize(
    "array",
    [pa.array([1], pa.uint64()), pa.array([[1]], pa.list_(pa.int64())), pa.array([1], pa.decimal256(40, 2))],
    ids=["uint64", "list", "decimal256_40_2"],
)
def test_schema_from_with_a_type_outside_the_vocabulary(tmp_path: Path, array: pa.Array) -> None:
    """Parquet can hold types the vocabulary lacks; each must be refused as a ConfigError, not a ValueError."""
    write_parquet(tmp_path / "schema.parquet", {"o_orderkey": pa.array([1]), "odd": array})
    bad(tmp_path, schema_from_doc("schema.parquet"), "unsupported column type")


@pytest.mark.parametrize("column", ["O_orderkey", "_version", "a.b"])
def test_schema_from_with_invalid_column_names(tmp_path: Path, column: str) -> None:
    """Column names from a file need the same allow-list as 'columns:' (and must not shadow _version)."""
    write_parquet(tmp_path / "schema.parquet", {"o_orderkey": pa.array([1]), column: pa.array([1])})
    bad(tmp_path, schema_from_doc("schema.parquet"), "column name", repr(column))


# --------------------------------------------------------------------------------------------------------------
# isolate_tables: the DAG files' load, where one bad table must not take the others down
# --------------------------------------------------------------------------------------------------------------


def test_isolate_tables_keeps_good_tables_and_records_the_bad_one(tmp_path: Path) -> None:
    doc = base_doc()
    good = copy.deepcopy(table(doc))
    doc["tables"]["items"] = {**good, "policy": {"schedule": "every hour"}}
    doc["tables"]["more"] = good
    path = write_defs(tmp_path, doc)
    bad(tmp_path, doc, "table items", "every hour")  # the default still raises on any bad table
    defs = load_definitions(path, isolate_tables=True)
    assert sorted(defs.tables) == ["more", "orders"]
    assert list(defs.table_errors) == ["items"]
    message = defs.table_errors["items"]
    assert str(path) in message and "table items" in message and "'every hour'" in message
    assert "\n" not in message


def test_isolate_tables_records_a_bad_table_name(tmp_path: Path) -> None:
    doc = base_doc()
    doc["tables"]["Bad-Name"] = copy.deepcopy(table(doc))
    defs = load_definitions(write_defs(tmp_path, doc), isolate_tables=True)
    assert list(defs.tables) == ["orders"]
    assert "invalid table name 'Bad-Name'" in defs.table_errors["Bad-Name"]


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d["sites"]["dr"].update(uri="ftp://host/x"), "unsupported scheme"),
        (lambda d: d.update(data_dir=["a", "b"]), "data_dir"),
        (lambda d: d.update(sites=None), "no sites"),
        (lambda d: d.update(extra=1), "unknown key"),
    ],
)
def test_isolate_tables_still_raises_for_the_whole_file(tmp_path: Path, mutate: Any, fragment: str) -> None:
    doc = base_doc()
    mutate(doc)
    with pytest.raises(ConfigError, match=fragment):
        load_definitions(write_defs(tmp_path, doc), isolate_tables=True)


def test_no_table_errors_by_default(tmp_path: Path) -> None:
    assert load(tmp_path, base_doc()).table_errors == {}

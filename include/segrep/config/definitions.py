"""The definitions file: sites, tables and their replication policies, reviewed in git.

Read by the CLI and, at DAG parse time, by the DAG factory; it never touches the catalog. ``segrep apply``
brings the catalog in line with it. Relative site paths and the data directory are resolved against the
definitions file's directory, so the same file works from any working directory.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from segrep.core import schema as sch
from segrep.core.errors import ConfigError, SegrepError
from segrep.core.names import check_name

CONFIG_ENV = "SEGREP_CONFIG"
DEFAULT_CONFIG = Path("include/segrep.yaml")
_DURATION_RE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class SiteDef:
    name: str
    site_id: int
    uri: str


@dataclass(frozen=True)
class Policy:
    """How a table replicates: schedule and the thresholds rounds, compaction and GC obey."""

    schedule: str | None = "@hourly"  # cron expression or preset, or a fixed interval such as "10m"
    start_date: date | datetime = date(2026, 1, 1)  # a date means midnight UTC
    end_date: date | datetime | None = None  # no scheduled runs after this (backfills still work before it)
    maintenance_schedule: str | None = "@daily"  # compaction and GC (the maintenance DAG)
    max_incoming_segments: int = 8
    spark_copy_threshold_bytes: int = 256 * 1024 * 1024
    retries: int = 3
    retry_delay_s: int = 30
    compact_min_segments: int = 10
    compact_min_bytes: int = 512 * 1024 * 1024
    tombstone_grace_s: int = 7 * 86400
    max_retention_s: int = 7 * 86400
    orphan_grace_s: int = 86400


@dataclass(frozen=True)
class TableDef:
    name: str
    schema: pa.Schema
    primary_key: tuple[str, ...]
    partition_key: str
    split_points: tuple[Any, ...]
    leader: str
    replicas: tuple[str, ...]
    policy: Policy

    @property
    def fingerprint(self) -> str:
        return sch.fingerprint(self.schema, self.primary_key)

    @property
    def sites(self) -> tuple[str, ...]:
        return (self.leader, *self.replicas)


@dataclass(frozen=True)
class Definitions:
    path: Path
    data_dir: Path
    catalog_url: str | None
    sites: dict[str, SiteDef] = field(default_factory=dict)
    tables: dict[str, TableDef] = field(default_factory=dict)

    def site(self, name: str) -> SiteDef:
        check_name("site", name)
        if name not in self.sites:
            raise SegrepError(f"unknown site {name!r}; defined: {', '.join(sorted(self.sites)) or 'none'}")
        return self.sites[name]

    def policy(self, name: str) -> Policy:
        """The table's policy, or the defaults for a table the catalog has but this file no longer defines."""
        return self.tables[name].policy if name in self.tables else Policy()

    def table(self, name: str) -> TableDef:
        check_name("table", name)
        if name not in self.tables:
            raise SegrepError(f"unknown table {name!r}; defined: {', '.join(sorted(self.tables)) or 'none'}")
        return self.tables[name]


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    return Path(explicit or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_definitions(path: str | os.PathLike[str] | None = None) -> Definitions:
    """Parse and validate the definitions file; raise ConfigError naming the file and the bad entry."""
    p = config_path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read definitions file {p}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        return _parse(doc, p.resolve())
    except ConfigError:
        raise
    except SegrepError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def _parse(doc: Any, path: Path) -> Definitions:
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping with 'sites' and 'tables'")
    _no_unknown_keys(doc, {"data_dir", "catalog_url", "sites", "tables"}, "top level")
    base = path.parent
    data_dir = (base / str(doc.get("data_dir", "data"))).resolve()
    sites = _parse_sites(doc.get("sites"), data_dir)
    tables = {
        check_name("table", name): _parse_table(name, body, sites, base)
        for name, body in _mapping(doc.get("tables") or {}, "tables").items()
    }
    catalog_url = doc.get("catalog_url")
    if catalog_url is not None and not isinstance(catalog_url, str):
        raise SegrepError("catalog_url must be a string (a SQLAlchemy URL)")
    return Definitions(path=path, data_dir=data_dir, catalog_url=catalog_url, sites=sites, tables=tables)


def _parse_sites(raw: Any, data_dir: Path) -> dict[str, SiteDef]:
    sites: dict[str, SiteDef] = {}
    ids: dict[int, str] = {}
    for name, body in _mapping(raw or {}, "sites").items():
        check_name("site", name)
        body = _mapping(body, f"site {name}")
        _no_unknown_keys(body, {"id", "uri"}, f"site {name}")
        site_id = body.get("id")
        if not isinstance(site_id, int) or isinstance(site_id, bool) or not 1 <= site_id <= 2**31 - 1:
            raise SegrepError(f"site {name}: 'id' must be a positive integer, unique among sites")
        if site_id in ids:
            raise SegrepError(f"site {name}: id {site_id} is already used by site {ids[site_id]}")
        ids[site_id] = name
        uri = body.get("uri")
        if not isinstance(uri, str) or not uri.strip():
            raise SegrepError(f"site {name}: 'uri' must be a path or URI")
        sites[name] = SiteDef(name=name, site_id=site_id, uri=_resolve_uri(uri.strip(), data_dir))
    if not sites:
        raise SegrepError("no sites defined")
    return sites


def _resolve_uri(uri: str, data_dir: Path) -> str:
    """Local paths become absolute (relative ones under data_dir); URIs with a scheme pass through."""
    if "://" in uri:
        if uri.startswith("file://"):
            return str(Path(uri[len("file://") :]).resolve())
        return uri
    p = Path(uri)
    return str((p if p.is_absolute() else data_dir / p).resolve())


def _parse_table(name: str, raw: Any, sites: Mapping[str, SiteDef], base: Path) -> TableDef:
    body = _mapping(raw, f"table {name}")
    where = f"table {name}"
    _no_unknown_keys(
        body,
        {"columns", "schema_from", "primary_key", "partition_key", "split_points", "leader", "replicas", "policy"},
        where,
    )
    if ("columns" in body) == ("schema_from" in body):
        raise SegrepError(f"{where}: give exactly one of 'columns' (name: type) or 'schema_from' (a Parquet file)")
    if "columns" in body:
        schema = _in(where, sch.schema_from_columns, _mapping(body["columns"], f"{where} columns"))
    else:
        schema = _schema_from_file(base / str(body["schema_from"]), where)
    if not len(schema):
        raise SegrepError(f"{where}: no columns")
    pk = body.get("primary_key")
    if isinstance(pk, str):
        pk = [pk]
    if not isinstance(pk, list) or not pk or not all(isinstance(c, str) for c in pk) or len(set(pk)) != len(pk):
        raise SegrepError(f"{where}: 'primary_key' must be a column name or a list of distinct column names")
    for col in pk:
        if col not in schema.names:
            raise SegrepError(f"{where}: primary key column {col!r} is not a column of the table")
    part = body.get("partition_key", pk[0])
    if part not in pk:
        raise SegrepError(f"{where}: partition_key {part!r} must be one of the primary key columns {pk}")
    split_points = _split_points(body.get("split_points") or [], schema.field(part).type, where)
    leader = body.get("leader")
    if not isinstance(leader, str) or leader not in sites:
        raise SegrepError(f"{where}: leader {leader!r} is not a defined site")
    replicas = body.get("replicas") or []
    if (
        not isinstance(replicas, list)
        or not all(isinstance(r, str) for r in replicas)
        or len(set(replicas)) != len(replicas)
    ):
        raise SegrepError(f"{where}: 'replicas' must be a list of distinct site names")
    for r in replicas:
        if r not in sites:
            raise SegrepError(f"{where}: replica {r!r} is not a defined site")
        if r == leader:
            raise SegrepError(f"{where}: the leader site {r} cannot also be a replica")
    return TableDef(
        name=name,
        schema=schema,
        primary_key=tuple(pk),
        partition_key=part,
        split_points=split_points,
        leader=leader,
        replicas=tuple(replicas),
        policy=_parse_policy(body.get("policy") or {}, where),
    )


def _schema_from_file(path: Path, where: str) -> pa.Schema:
    try:
        arrow_schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise SegrepError(f"{where}: cannot read schema_from file {path}: {exc}") from None
    return _in(f"{where} (schema_from {path})", sch.schema_from_arrow, arrow_schema)


def _in(where: str, fn: Any, arg: Any) -> Any:
    """Call ``fn(arg)``, prefixing any SegrepError with where it happened."""
    try:
        return fn(arg)
    except SegrepError as exc:
        raise SegrepError(f"{where}: {exc}") from None


def _split_points(raw: Any, dtype: pa.DataType, where: str) -> tuple[Any, ...]:
    if not isinstance(raw, list):
        raise SegrepError(f"{where}: 'split_points' must be a list")
    try:
        values = pa.array(raw).cast(dtype, safe=True).to_pylist() if raw else []
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise SegrepError(f"{where}: split_points do not fit the partition key type {dtype}: {exc}") from None
    if any(v is None for v in values) or any(a >= b for a, b in itertools.pairwise(values)):
        raise SegrepError(f"{where}: split_points must be non-null and strictly ascending")
    return tuple(values)


def _parse_policy(raw: Any, where: str) -> Policy:
    body = dict(_mapping(raw, f"{where} policy"))
    defaults = Policy()
    known = set(Policy.__dataclass_fields__)
    _no_unknown_keys(body, known, f"{where} policy")
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("schedule", "maintenance_schedule"):
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise SegrepError(f"{where} policy: schedule must be a cron expression, a preset or null")
            values[key] = value
        elif key in ("start_date", "end_date"):
            values[key] = None if value is None and key == "end_date" else _date(value, where, key)
        elif key.endswith("_s"):
            values[key] = _duration(value, f"{where} policy {key}")
        else:
            low = 0 if key == "retries" else 1  # no retry is a valid choice; no segment in flight is not
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                kind = "a non-negative" if low == 0 else "a positive"
                raise SegrepError(f"{where} policy: {key} must be {kind} integer")
            values[key] = value
    policy = Policy(**{**defaults.__dict__, **values})
    if policy.tombstone_grace_s < policy.max_retention_s:
        raise SegrepError(
            f"{where} policy: tombstone_grace_s must be at least max_retention_s, or a replica away for the "
            "whole retention could resurrect deleted rows"
        )
    return policy


def _duration(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _DURATION_RE.match(str(value).strip()) if isinstance(value, str) else None
    if not m:
        raise SegrepError(f"{where}: expected seconds or a duration like 30s, 15m, 12h, 7d, 2w; got {value!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _date(value: Any, where: str, key: str = "start_date") -> date | datetime:
    """A date (midnight UTC) or an ISO-8601 date-time (UTC unless it names a zone)."""
    if isinstance(value, date):
        return value
    try:
        text = str(value)
        return datetime.fromisoformat(text) if "T" in text or " " in text.strip() else date.fromisoformat(text)
    except ValueError:
        raise SegrepError(
            f"{where} policy: {key} must be a date YYYY-MM-DD or a date-time YYYY-MM-DDTHH:MM:SS, got {value!r}"
        ) from None


def schedule_interval_s(schedule: str | None) -> int | None:
    """Seconds if the schedule is a fixed interval such as ``10m``; None for cron expressions and presets."""
    m = _DURATION_RE.match(schedule.strip()) if schedule else None
    return int(m.group(1)) * _UNITS[m.group(2)] if m else None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise SegrepError(f"{where}: expected a mapping")
    return value


def _no_unknown_keys(body: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(body) - known, key=str)
    if unknown:
        raise SegrepError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}")

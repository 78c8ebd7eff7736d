"""The definitions file: sites, tables and their replication policies, and the links between sites (their
byte-rate caps, :mod:`segrep.config.links`), reviewed in git.

Read by the CLI and, at DAG parse time, by the DAG factory; it never touches the catalog and creates nothing.
``segrep apply`` brings the catalog in line with it. Relative site paths and the data directory are resolved
against the definitions file's directory, so the same file works from any working directory. Every bad entry
is a ConfigError naming the file and the entry; the DAG files load with ``isolate_tables=True`` so one table's
bad definition leaves the other tables' DAGs standing.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from segrep.config import locations, stores
from segrep.config.entries import expect_mapping, no_unknown_keys
from segrep.config.iceberg_catalog import IcebergCatalogDef, parse_iceberg_catalog
from segrep.config.links import LinkDef, parse_links
from segrep.config.policy import POLICY_KEYS, Policy, parse_policy
from segrep.config.schedule import parse_schedule
from segrep.config.stores import StoreOptions
from segrep.config.yamlfile import read_yaml
from segrep.core import keys
from segrep.core import schema as sch
from segrep.core.errors import ConfigError, SegrepError
from segrep.core.names import check_name
from segrep.core.schema_changes import ColumnSpec, version_fingerprint
from segrep.core.schema_versions import first_version

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "Definitions",
    "LinkDef",
    "Policy",
    "SiteDef",
    "TableDef",
    "config_path",
    "load_definitions",
    "schedule_interval_s",
]

CONFIG_ENV = "SEGREP_CONFIG"
DEFAULT_CONFIG = Path("include/segrep.yaml")
_TOP_LEVEL = {"data_dir", "catalog_url", "sites", "tables", "links", "iceberg_catalog"}
WRITES_LEADER = "leader"
WRITES_ANY_SITE = "any_site"
WRITES = (WRITES_LEADER, WRITES_ANY_SITE)


@dataclass(frozen=True)
class SiteDef:
    name: str
    site_id: int
    uri: str
    store: StoreOptions = field(default_factory=StoreOptions)  # endpoint, credentials reference (config/stores.py)


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
    # a cascaded replica -> the site that feeds it (``replicas: {edge: {from: dr}}``); others are fed by the
    # partition's leader. Acyclic (checked when the file is read).
    feeders: Mapping[str, str] = field(default_factory=dict)
    # initial partition index -> the site that leads it (``leaders: {1: eu}``); the others are led by ``leader``
    leaders: Mapping[int, str] = field(default_factory=dict)
    writes: str = WRITES_LEADER  # "any_site": every site accepts writes (active-active, DESIGN section 12)
    # the columns as written, with their defaults and former names (``schema`` is their Arrow form); empty:
    # taken from ``schema`` (no defaults, no renames)
    columns: tuple[ColumnSpec, ...] = ()

    @property
    def column_specs(self) -> tuple[ColumnSpec, ...]:
        return self.columns or tuple(ColumnSpec(n, t) for n, t in sch.schema_to_columns(self.schema).items())

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the table's first schema version (field ids 1..n in column order)."""
        return version_fingerprint(first_version(sch.schema_to_columns(self.schema)), self.primary_key)

    @property
    def sites(self) -> tuple[str, ...]:
        return (self.leader, *self.replicas)

    def leader_of(self, index: int) -> str:
        """The site that leads the table's ``index``-th initial partition."""
        return self.leaders.get(index, self.leader)


@dataclass(frozen=True)
class Definitions:
    path: Path
    data_dir: Path
    catalog_url: str | None
    sites: dict[str, SiteDef] = field(default_factory=dict)
    tables: dict[str, TableDef] = field(default_factory=dict)
    # with isolate_tables=True: each table left out because its own definition is invalid -> its one-line error
    table_errors: dict[str, str] = field(default_factory=dict)
    links: tuple[LinkDef, ...] = ()  # at most one per direction (checked when the file is read)
    iceberg_catalog: IcebergCatalogDef = field(default_factory=IcebergCatalogDef)  # where open tables register

    def link(self, source: str, target: str) -> LinkDef | None:
        """The link copies from ``source`` to ``target`` cross, or None when no entry names that direction."""
        return next((x for x in self.links if x.applies_to(source, target)), None)

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


def load_definitions(path: str | os.PathLike[str] | None = None, *, isolate_tables: bool = False) -> Definitions:
    """Parse and validate the definitions file; raise ConfigError naming the file and the bad entry.

    With ``isolate_tables`` a table whose own definition is invalid is left out of ``tables`` and its error
    recorded in ``table_errors`` (the DAG files: one bad table must not take the others' DAGs down); errors of
    the file as a whole (reading, YAML, top level, sites, links) still raise.
    """
    p = config_path(path)
    doc = read_yaml(p)
    try:
        return _parse(doc, p, isolate_tables)
    except ConfigError:
        raise
    except SegrepError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def _parse(doc: Any, p: Path, isolate_tables: bool) -> Definitions:
    if not isinstance(doc, dict):
        raise SegrepError("expected a mapping with 'sites' and 'tables'")
    no_unknown_keys(doc, _TOP_LEVEL, "top level")
    try:
        path = p.resolve()
    except (OSError, RuntimeError) as exc:
        raise SegrepError(f"cannot resolve the file's path: {exc}") from None
    base = path.parent
    data_dir = locations.data_dir(doc.get("data_dir", "data"), base)
    catalog_url = doc.get("catalog_url")
    if catalog_url is not None and (
        not isinstance(catalog_url, str) or not catalog_url.strip() or "\x00" in catalog_url
    ):
        raise SegrepError(f"catalog_url must be a SQLAlchemy URL (a string), got {catalog_url!r}")
    sites = _parse_sites(doc.get("sites"), data_dir)
    stores.remember((sdef.name, sdef.uri, sdef.store) for sdef in sites.values())
    links = parse_links(doc.get("links"), sites)
    iceberg_catalog = parse_iceberg_catalog(doc.get("iceberg_catalog"))
    tables: dict[str, TableDef] = {}
    table_errors: dict[str, str] = {}
    for name, body in expect_mapping(_given(doc, "tables", {}), "tables").items():
        try:
            tables[check_name("table", name)] = _parse_table(name, body, sites, base)
        except SegrepError as exc:
            if not isolate_tables:
                raise
            table_errors[str(name)] = f"{p}: {exc}"
    return Definitions(
        path=path,
        data_dir=data_dir,
        catalog_url=catalog_url,
        sites=sites,
        tables=tables,
        table_errors=table_errors,
        links=links,
        iceberg_catalog=iceberg_catalog,
    )


def _parse_sites(raw: Any, data_dir: Path) -> dict[str, SiteDef]:
    sites: dict[str, SiteDef] = {}
    ids: dict[int, str] = {}
    for name, body in expect_mapping({} if raw is None else raw, "sites").items():
        check_name("site", name)
        body = expect_mapping(body, f"site {name}")
        no_unknown_keys(body, {"id", "uri", "storage_options", "credentials"}, f"site {name}")
        site_id = body.get("id")
        if not isinstance(site_id, int) or isinstance(site_id, bool) or not 1 <= site_id <= 2**31 - 1:
            raise SegrepError(f"site {name}: 'id' must be a positive integer, unique among sites")
        if site_id in ids:
            raise SegrepError(f"site {name}: id {site_id} is already used by site {ids[site_id]}")
        ids[site_id] = name
        uri = body.get("uri")
        if not isinstance(uri, str) or not uri.strip():
            raise SegrepError(f"site {name}: 'uri' must be a path or URI")
        resolved = locations.site_uri(name, uri.strip(), data_dir)
        store = stores.parse_store(name, resolved, body.get("storage_options"), body.get("credentials"))
        sites[name] = SiteDef(name=name, site_id=site_id, uri=resolved, store=store)
    if not sites:
        raise SegrepError("no sites defined")
    return sites


def _parse_table(name: str, raw: Any, sites: Mapping[str, SiteDef], base: Path) -> TableDef:
    body = expect_mapping(raw, f"table {name}")
    where = f"table {name}"
    no_unknown_keys(
        body,
        {
            "columns",
            "schema_from",
            "primary_key",
            "partition_key",
            "split_points",
            "leader",
            "leaders",
            "replicas",
            "writes",
            "policy",
        },
        where,
    )
    if ("columns" in body) == ("schema_from" in body):
        raise SegrepError(f"{where}: give exactly one of 'columns' (name: type) or 'schema_from' (a Parquet file)")
    specs: tuple[ColumnSpec, ...] = ()
    if "columns" in body:
        specs = _column_specs(expect_mapping(body["columns"], f"{where} columns"), where)
        schema = _in(where, sch.schema_from_columns, {c.name: c.type for c in specs})
    else:
        schema = _schema_from_file(body["schema_from"], base, where)
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
    split_points = _split_points(_given(body, "split_points", []), schema.field(part).type, where)
    leader = body.get("leader")
    if not isinstance(leader, str) or leader not in sites:
        raise SegrepError(f"{where}: leader {leader!r} is not a defined site")
    replicas, feeders = _replicas(_given(body, "replicas", []), sites, leader, where)
    leaders = _leaders(_given(body, "leaders", {}), len(split_points) + 1, (leader, *replicas), where)
    writes = _given(body, "writes", WRITES_LEADER)
    if writes not in WRITES:
        raise SegrepError(f"{where}: 'writes' must be one of {', '.join(WRITES)}; got {writes!r}")
    return TableDef(
        name=name,
        schema=schema,
        primary_key=tuple(pk),
        partition_key=part,
        split_points=split_points,
        leader=leader,
        replicas=tuple(replicas),
        policy=_parse_policy(_given(body, "policy", {}), where),
        feeders=feeders,
        leaders=leaders,
        writes=writes,
        columns=specs,
    )


_COLUMN_KEYS = {"type", "default", "renamed_from"}


def _column_specs(raw: Mapping[str, Any], where: str) -> tuple[ColumnSpec, ...]:
    """``name: type`` or ``name: {type: T, default: V, renamed_from: OLD}``; the type normalized, the default
    converted to the type without loss (its JSON form, ``keys.encode``)."""
    out = []
    for name, value in raw.items():
        check_name("column", name)
        body: Mapping[str, Any] = value if isinstance(value, dict) else {"type": value}
        no_unknown_keys(body, _COLUMN_KEYS, f"{where} column {name}")
        try:
            dtype = sch.parse_type(body.get("type"))  # type: ignore[arg-type]
        except SegrepError as exc:
            raise SegrepError(f"{where}: column {name}: {exc}") from None
        default = body.get("default")
        if default is not None:
            try:
                default = keys.encode(keys.from_user(default, dtype, "default"))
            except SegrepError as exc:
                reason = str(exc).split(": ", 1)[-1]
                raise SegrepError(
                    f"{where}: column {name}: default {default!r} is not a {sch.type_name(dtype)} value ({reason}); "
                    "give a default of the column's type"
                ) from None
        renamed = body.get("renamed_from")
        if renamed is not None:
            if not isinstance(renamed, str):
                raise SegrepError(f"{where}: column {name}: renamed_from must be a column name, got {renamed!r}")
            check_name("column", renamed)
        out.append(ColumnSpec(str(name), sch.type_name(dtype), default, renamed))
    return tuple(out)


def _replicas(raw: Any, sites: Mapping[str, SiteDef], leader: str, where: str) -> tuple[list[str], dict[str, str]]:
    """The replica sites and the feeders of cascaded ones: a list of names, or a mapping name -> options
    (``{}``/null, or ``{from: FEEDER}``). A feeder is the leader or another replica; cycles are refused by name
    (each replica must reach the leader through its feeders)."""
    feeders: dict[str, str] = {}
    if isinstance(raw, dict):
        replicas = [str(r) for r in raw]
        for name, options in raw.items():
            options = {} if options is None else expect_mapping(options, f"{where} replica {name}")
            no_unknown_keys(options, {"from"}, f"{where} replica {name}")
            if "from" in options:
                feeder = options["from"]
                if not isinstance(feeder, str) or (feeder != leader and feeder not in raw):
                    raise SegrepError(
                        f"{where}: replica {name} is fed 'from' {feeder!r}, which is neither the leader nor a "
                        "replica of the table"
                    )
                if feeder == name:
                    raise SegrepError(f"{where}: replica {name} cannot be fed from itself")
                feeders[str(name)] = feeder
    elif isinstance(raw, list) and all(isinstance(r, str) for r in raw):
        replicas = list(raw)
    else:
        raise SegrepError(f"{where}: 'replicas' must be a list of site names or a mapping of site name -> options")
    if len(set(replicas)) != len(replicas):
        raise SegrepError(f"{where}: 'replicas' must be a list of distinct site names")
    for r in replicas:
        if r not in sites:
            raise SegrepError(f"{where}: replica {r!r} is not a defined site")
        if r == leader:
            raise SegrepError(f"{where}: the leader site {r} cannot also be a replica")
    for start in sorted(feeders):
        path = [start]
        while path[-1] in feeders:
            nxt = feeders[path[-1]]
            if nxt in path:
                cycle = " -> ".join([*path[path.index(nxt) :], nxt])
                raise SegrepError(f"{where}: the replicas' feeders form a cycle: {cycle}")
            path.append(nxt)
    return replicas, feeders


def _leaders(raw: Any, partitions: int, sites: tuple[str, ...], where: str) -> dict[int, str]:
    """Per-partition leaders: initial partition index (0 .. len(split_points)) -> one of the table's sites."""
    out: dict[int, str] = {}
    given: Mapping[Any, Any] = expect_mapping(raw, f"{where} leaders")  # YAML keys: partition indexes are ints
    for index, site in given.items():
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < partitions:
            raise SegrepError(
                f"{where} leaders: {index!r} is not a partition index (0 to {partitions - 1}: one per range "
                "between split points)"
            )
        if site not in sites:
            raise SegrepError(
                f"{where} leaders: partition {index} is led by {site!r}, which is not one of the table's sites "
                f"({', '.join(sites)})"
            )
        out[index] = site
    return out


def _schema_from_file(raw: Any, base: Path, where: str) -> pa.Schema:
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        raise SegrepError(f"{where}: 'schema_from' must be the path of a Parquet file, got {raw!r}")
    path = base / raw.strip()
    try:
        arrow_schema = pq.read_schema(path)
    except (OSError, pa.ArrowException, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SegrepError(f"{where}: cannot read schema_from file {path}: {reason}") from None
    return _in(f"{where} (schema_from {path})", sch.schema_from_arrow, arrow_schema)


def _in(where: str, fn: Any, arg: Any) -> Any:
    """Call ``fn(arg)``, prefixing any SegrepError with where it happened."""
    try:
        return fn(arg)
    except SegrepError as exc:
        raise SegrepError(f"{where}: {exc}") from None


def _split_points(raw: Any, dtype: pa.DataType, where: str) -> tuple[Any, ...]:
    """The partition bounds, each converted strictly (keys.from_user: no NaN, bool, overflow), ascending."""
    if not isinstance(raw, list):
        raise SegrepError(f"{where}: 'split_points' must be a list")
    values = [keys.from_user(v, dtype, f"{where}: split_points[{i}]") for i, v in enumerate(raw)]
    for i, (a, b) in enumerate(itertools.pairwise(values)):
        if not a < b:
            raise SegrepError(
                f"{where}: split_points must be strictly ascending: split_points[{i + 1}] {keys.encode(b)!r} "
                f"does not come after {keys.encode(a)!r}"
            )
    return tuple(values)


def _parse_policy(raw: Any, where: str) -> Policy:
    body = dict(expect_mapping(raw, f"{where} policy"))
    no_unknown_keys(body, set(POLICY_KEYS), f"{where} policy")
    return parse_policy(body, f"{where} policy")


def schedule_interval_s(schedule: str | None) -> int | None:
    """Seconds if the schedule is a fixed interval such as ``10m``; None for cron expressions, presets,
    ``on_write`` and null. Prefer :func:`segrep.config.schedule.parse_schedule`, which also gives the cron
    expression."""
    parsed = parse_schedule(schedule, on_write=True)
    return parsed.interval_s if parsed else None


def _given(body: Mapping[str, Any], key: str, default: Any) -> Any:
    """``body[key]``, or ``default`` when absent or null (never for other empty values: ``replicas: 0`` is an
    error, not an empty list)."""
    value = body.get(key)
    return default if value is None else value

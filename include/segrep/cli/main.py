"""The ``segrep`` command: administration, and the same steps the DAGs run, without Airflow.

Every user error is one line on stderr and exit code 2, with nothing written; an unreachable catalog is
exit code 1 with the URL named. ``SEGREP_DEBUG=1`` shows tracebacks for bug reports.
"""

from __future__ import annotations

import csv
import functools
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from sqlalchemy.exc import OperationalError

from segrep import __version__
from segrep.catalog import Catalog, resolve_url
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.models import MAX_PARTITION_ID
from segrep.catalog.request_slots import shared_site_requests
from segrep.cli.format import format_rows
from segrep.cli.no_pandas import hide_pandas
from segrep.config.definitions import Definitions, config_path, load_definitions
from segrep.config.locations import redact_uri
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.core.settings import MAX_SCRUB_BYTES_PER_S
from segrep.data.export import atomic_write_table, check_output, protected_paths
from segrep.storage.probe import describe

F = TypeVar("F", bound=Callable[..., Any])
INT64_MAX = 2**63 - 1
# Numbers the catalog stores as 64-bit integers: anything larger is refused by the option, not by the database.
VERSION = click.IntRange(min=0, max=INT64_MAX)
PARTITION_ID = click.IntRange(min=1, max=MAX_PARTITION_ID)
COUNT = click.IntRange(min=0, max=INT64_MAX)
FAILOVER_ID = click.IntRange(min=1, max=INT64_MAX)


class Context:
    """Lazily loads the definitions and opens the catalog, so commands that need neither stay fast."""

    def __init__(self, config: str | None, catalog_url: str | None) -> None:
        self._config = config
        self._catalog_url = catalog_url
        self._defs: Definitions | None = None
        self._catalog: Catalog | None = None

    @property
    def defs(self) -> Definitions:
        if self._defs is None:
            self._defs = load_definitions(self._config)
        return self._defs

    def defs_if_any(self) -> Definitions | None:
        """The definitions, or None when there is no definitions file (a command given only --catalog)."""
        if self._defs is None and not config_path(self._config).exists():
            return None
        return self.defs

    @property
    def opened(self) -> Catalog | None:
        """The catalog if a command opened it (to name it, password hidden, when it cannot be reached)."""
        return self._catalog

    def catalog(self, *, initialized: bool = True) -> Catalog:
        if self._catalog is None:
            url = self._catalog_url or os.environ.get("SEGREP_CATALOG_URL")
            # The definitions, when there is a file, also say how to reach each site's store (endpoint,
            # credentials reference): a command given --catalog opens sites too. Without a file, local
            # sites work and an object-store site is refused by name when opened (config.stores.options_for).
            self.defs_if_any()
            if url is None:
                url = resolve_url(None, self.defs.catalog_url, self.defs.data_dir)
            self._catalog = Catalog(url)
            command = click.get_current_context(silent=True)
            if command is not None:  # the command's S3 requests share each site's rate with the deployment
                command.with_resource(shared_site_requests(self._catalog))
        if initialized:
            self._catalog.require_initialized()
        return self._catalog


def _user_errors(fn: F) -> F:
    """Turn SegrepError into one line and exit code 2; an unreachable catalog into exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SegrepError as exc:
            _fail(str(exc), 2)
        except OperationalError as exc:
            if os.environ.get("SEGREP_DEBUG"):
                raise
            obj = args[0] if args and isinstance(args[0], Context) else None
            named = f" {obj.opened.safe_url}" if obj is not None and obj.opened is not None else ""
            _fail(f"catalog{named} unreachable or failing: {str(exc.orig).strip().splitlines()[0]}", 1)

    return wrapper  # type: ignore[return-value]


def _fail(message: str, code: int) -> None:
    click.echo(f"segrep: error: {message}", err=True)
    sys.exit(code)


class _OneLineErrors(click.Group):
    """Click's usage errors (a bad option value, a missing argument) as the same one line every other user
    error gets, exit code 2, instead of a usage block: scripts and people read one form of error."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> Any:
        if extra.pop("standalone_mode", True) is False:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            sys.exit(2)
        except click.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
            _fail(f"{exc.format_message()}{hint}", 2)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("aborted", 1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="segrep")
@click.option(
    "--config",
    "config",
    envvar="SEGREP_CONFIG",
    default=None,
    metavar="FILE",
    help="Definitions file (sites, tables, policies). Default: $SEGREP_CONFIG or include/segrep.yaml.",
)
@click.option(
    "--catalog",
    "catalog_url",
    envvar="SEGREP_CATALOG_URL",
    default=None,
    metavar="URL",
    help="Catalog SQLAlchemy URL. Default: $SEGREP_CATALOG_URL, the definitions' catalog_url, or "
    "sqlite:///<data_dir>/catalog.db.",
)
@click.pass_context
def main(ctx: click.Context, config: str | None, catalog_url: str | None) -> None:
    """segrep replicates partitioned tables between sites by copying immutable segment files.

    Typical first steps: `segrep init`, `segrep apply`, `segrep write TABLE FILE`, `segrep read TABLE`.
    """
    ctx.obj = Context(config, catalog_url)


# -- catalog ---------------------------------------------------------------------------------------------
@main.command()
@click.pass_obj
@_user_errors
def init(obj: Context) -> None:
    """Create or upgrade the catalog schema to the newest migration (safe to run again)."""
    from segrep.catalog.migrate import upgrade

    catalog = obj.catalog(initialized=False)
    catalog.require_known_revision()
    before, after = upgrade(catalog)
    catalog.require_every_table()  # at head already, a dropped table is not made again: say so
    if before == after:
        click.echo(f"catalog {catalog.safe_url} is up to date (revision {after})")
    else:
        click.echo(f"catalog {catalog.safe_url} upgraded from {before or 'empty'} to revision {after}")


@main.command()
@click.option("--dry-run", is_flag=True, help="Print what would change; write nothing.")
@click.option(
    "--site-down",
    "down",
    multiple=True,
    help="A defined site known to be unreachable (a lost region): recorded without probing its store (repeatable).",
)
@click.pass_obj
@_user_errors
def apply(obj: Context, dry_run: bool, down: tuple[str, ...]) -> None:
    """Validate the definitions file and bring the catalog in line with it."""
    from segrep.catalog.apply import apply_definitions

    for site in down:
        obj.defs.site(site)  # an unknown name is refused before anything is done
        click.echo(f"site {site}: not probed (--site-down); it is recorded as defined")
    changes = apply_definitions(obj.catalog(), obj.defs, dry_run=dry_run, unprobed=set(down))
    prefix = "would " if dry_run else ""
    for change in changes:
        click.echo(f"{prefix}{change}")
    for link in obj.defs.links:  # read from the definitions by each copier; the catalog keeps no copy
        click.echo(f"{'link':<7} {link.summary()}")
    if not changes:
        click.echo(f"catalog matches {obj.defs.path}: nothing to change")
    if not dry_run:  # a schema change is published at once (the tables' Iceberg schemas and name mappings)
        from segrep.replication.publication import publish

        for table in obj.defs.tables:
            for pub in publish(obj.catalog(), obj.defs, table).sites:
                if pub.status != "unchanged":
                    click.echo(f"{table}: {pub.line()}", err=pub.status == "failed")


@main.group("catalog")
def catalog_group() -> None:
    """Catalog maintenance."""


@catalog_group.command("rebuild")
@click.option("--site", "site", required=True, help="Site whose segment lists are rebuilt from its files.")
@click.option("--dry-run", is_flag=True, help="Report what the files say; change nothing.")
@click.option(
    "--accept-loss",
    is_flag=True,
    help="Drop catalog segments whose files are gone, and accept a chain head the catalog never knew.",
)
@click.pass_obj
@_user_errors
def catalog_rebuild(obj: Context, site: str, dry_run: bool, accept_loss: bool) -> None:
    """Reconstruct a site's segment lists and roots from the metadata in its segment files.

    Refuses, naming each one, when a segment the catalog lists has no file at the site, or when a file
    would become a root the catalog never had, unless --accept-loss says that loss is known and accepted."""
    from segrep.catalog.rebuild import rebuild_site

    report = rebuild_site(obj.catalog(), site, dry_run=dry_run, accept_loss=accept_loss)
    for line in report.lines():
        click.echo(line)


# -- sites and tables ------------------------------------------------------------------------------------
@main.group("site")
def site_group() -> None:
    """Sites (storage roots in data centers)."""


@site_group.command("list")
@click.pass_obj
@_user_errors
def site_list(obj: Context) -> None:
    """List the sites the catalog knows, with their placements and segments; then the links between them
    defined in the definitions file: the cap in force now, where it comes from, and when it changes next."""
    from datetime import UTC, datetime

    from sqlalchemy import func, select

    from segrep.cli.views import link_lines, link_states

    with obj.catalog().read() as s:
        counts = dict(
            s.execute(
                select(m.Placement.site_id, func.count())
                .where(m.Placement.removed_us.is_(None))
                .group_by(m.Placement.site_id)
            ).all()
        )
        segs = dict(
            s.execute(select(m.Placement.site_id, func.count()).join(m.Segment).group_by(m.Placement.site_id)).all()
        )
        rows = [
            [x.name, x.site_id, redact_uri(x.uri), counts.get(x.site_id, 0), segs.get(x.site_id, 0), _identity(s, x)]
            for x in s.scalars(select(m.Site).order_by(m.Site.name))
        ]
    click.echo(format_rows(["site", "id", "uri", "placements", "segments", "identity"], rows))
    links = link_lines(link_states(obj.defs_if_any(), datetime.now(UTC)))
    if links:
        click.echo("\n".join(["", *links]))


def _identity(s: Any, row: m.Site) -> str:
    """The site's identity marker as `site list` shows it: ok and its uuid, or why it is DOWN/UNIDENTIFIED."""
    from segrep.catalog.site_identity import check_site
    from segrep.storage.stores import STORE_ERRORS

    try:
        check = check_site(s, row)
    except STORE_ERRORS as exc:
        return f"unreachable: {describe(exc)}"
    if check.ok:
        return f"ok ({row.site_uuid})"
    return f"DOWN/UNIDENTIFIED: {check.problem}"


@site_group.command("adopt")
@click.argument("site")
@click.option("--dry-run", is_flag=True, help="Say what the root holds and what would be written; write nothing.")
@click.pass_obj
@_user_errors
def site_adopt(obj: Context, site: str, dry_run: bool) -> None:
    """Claim SITE's root for this catalog: write its identity marker (creating the root if it is missing).

    For a root that is really the site but lost its marker, was restored or replaced, or was claimed by a
    catalog that is gone. Rounds, writes and repairs never create a root themselves: a root without this
    catalog's marker is DOWN/UNIDENTIFIED until it is adopted. The marker of another site of this catalog is
    never overwritten."""
    from segrep.catalog import site_identity

    catalog = obj.catalog()
    if dry_run:
        with catalog.read() as s:
            row = q.site_by_name(s, site)
            check = site_identity.check_site(s, row)
        click.echo(f"{check.detail}: would write the identity marker of site {site} (dry run: nothing written)")
        return
    with catalog.write() as s:
        claim = site_identity.claim(s, q.site_by_name(s, site), adopt=True)
    click.echo(str(claim))


@main.group("table")
def table_group() -> None:
    """Replicated tables."""


@table_group.command("list")
@click.pass_obj
@_user_errors
def table_list(obj: Context) -> None:
    """List tables with their key, partitions and sites."""
    from segrep.cli.views import table_overview

    rows = table_overview(obj.catalog())
    click.echo(format_rows(["table", "key", "partitions", "leader", "replicas", "segments", "rows@leader"], rows))


@table_group.command("describe")
@click.argument("table")
@click.pass_obj
@_user_errors
def table_describe(obj: Context, table: str) -> None:
    """Columns, key, partitions (range, state, epoch, leader) and placements of a table."""
    from segrep.cli.views import describe_table

    click.echo(describe_table(obj.catalog(), table))


@table_group.command("rewrite")
@click.argument("source")
@click.option("--into", "target", required=True, help="The table to copy into (defined and applied already).")
@click.option("--map", "renames", multiple=True, metavar="OLD=NEW", help="Copy SOURCE's column OLD into NEW.")
@click.option("--dry-run", is_flag=True, help="Check every row and print what would be written; write nothing.")
@click.option(
    "--into-nonempty", is_flag=True, help="Copy even if TARGET holds rows (an upsert over them; else refused)."
)
@click.pass_obj
@_user_errors
def table_rewrite(
    obj: Context, source: str, target: str, renames: tuple[str, ...], dry_run: bool, into_nonempty: bool
) -> None:
    """Copy SOURCE's rows (at its leaders) into TARGET, a table with a new shape, column by name.

    The way out of a schema change `segrep apply` refuses (a narrowing, a type family change, a key column's
    change). Every value must convert exactly to TARGET's type, or nothing is written; TARGET must hold no rows
    (--into-nonempty: copy over them). One commit: a copy that fails half-way writes nothing, run it again.
    Stop SOURCE's writers first: rows written during the copy may be missed."""
    from segrep.data.rewrite import parse_renames, rewrite_table

    result = rewrite_table(
        obj.catalog(),
        source,
        target,
        renames=parse_renames(renames),
        dry_run=dry_run,
        into_nonempty=into_nonempty,
    )
    if dry_run:
        click.echo(
            f"would write {result.rows} row(s) of {source} into {target} in one commit "
            f"(read from {result.partitions} source partition(s), one at a time)"
        )
    else:
        click.echo(
            f"wrote {result.rows_written} row(s) of {source} into {target} in one commit "
            f"({result.rows} read from {result.partitions} source partition(s), {result.segments} segment(s))"
        )
    for col in result.columns:
        click.echo(f"  {col}")


# -- data ------------------------------------------------------------------------------------------------
@main.command()
@click.argument("table")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv"]), default=None, help="Default: from the suffix.")
@click.option("--delete", is_flag=True, help="FILE holds primary keys to delete (only the key columns).")
@click.option(
    "--site",
    default=None,
    help="Write at this site (a table with `writes: any_site` takes writes anywhere). Default: each leader.",
)
@click.pass_obj
@_user_errors
def write(obj: Context, table: str, file: Path, fmt: str | None, delete: bool, site: str | None) -> None:
    """Write a batch of rows (upsert by primary key) or of keys to delete, at each partition's leader.

    A table whose policy is `schedule: on_write` then tells Airflow (SEGREP_AIRFLOW_API_URL, _USER,
    _PASSWORD); if that fails the write stays committed and a warning on stderr says why."""
    from segrep.catalog.schemas import schema_history
    from segrep.data.writer import write_batch
    from segrep.replication.publication import publish_written

    catalog = obj.catalog()
    with catalog.read() as s:
        info = q.table_info(s, table)
        # a CSV column is read as its type at the newest version that has the name (an older writer's file)
        types = {c.name: c.arrow_type for e in schema_history(s, info.table_id) for c in e.schema.columns}
    batch = _read_input(file, fmt, types)
    result = write_batch(catalog, table, batch, delete=delete, site=site, defs=obj.defs_if_any())
    action = "deleted" if delete else "wrote"
    click.echo(
        f"{action} {result.rows_written} row(s) of {table} from {file} "
        f"({result.rows_in - result.rows_written} duplicate key(s) folded) in {len(result.segments)} segment(s)"
    )
    if result.batch_version != result.stored_version:
        click.echo(
            f"  the file has the columns of schema version {result.batch_version}: stored at the current "
            f"version {result.stored_version}"
        )
    for seg in result.segments:
        click.echo(
            f"  partition {seg.partition_id} @ {seg.site}: segment {seg.segment_id} {seg.rows} rows {seg.byte_size} B"
        )
    if result.event is not None and result.event.sent:
        click.echo(f"  {result.event.detail}")
    elif result.event is not None:
        click.echo(f"segrep: warning: {result.event.detail}", err=True)
    for pub in publish_written(catalog, obj.defs_if_any(), result).sites:
        failed = pub.status == "failed"
        click.echo(
            f"segrep: warning: the write is committed; {pub.line()}" if failed else f"  {pub.line()}", err=failed
        )


def _read_input(file: Path, fmt: str | None, types: dict[str, pa.DataType]) -> pa.Table:
    fmt = fmt or _format_from_suffix(file, ("parquet", "csv"))
    try:
        if fmt == "parquet":
            return pq.read_table(file)
        return pacsv.read_csv(file, convert_options=pacsv.ConvertOptions(column_types=types))
    except FileNotFoundError:
        raise SegrepError(f"cannot read {file}: no such file") from None
    except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SegrepError(f"cannot read {file} as {fmt}: {_name_csv_column(file, str(exc).splitlines()[0])}") from None


def _name_csv_column(file: Path, message: str) -> str:
    """Arrow's CSV errors say "In CSV column #3"; a user knows the column by its name (from the header)."""
    found = re.match(r"In CSV column #(\d+): (.*)", message)
    if found is None:
        return message
    with file.open(newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), [])
    index = int(found.group(1))
    name = header[index] if index < len(header) else f"#{index}"
    return f"column {name}: {found.group(2)}"


def _format_from_suffix(file: Path, allowed: Sequence[str]) -> str:
    suffix = file.suffix.lower().lstrip(".")
    suffix = {"pq": "parquet", "txt": "table"}.get(suffix, suffix)
    if suffix not in allowed:
        raise SegrepError(f"cannot tell the format of {file} from its suffix; pass --format ({'|'.join(allowed)})")
    return suffix


@main.command()
@click.argument("table")
@click.option("--site", default=None, help="Read the replicas at this site. Default: each partition's leader.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Write rows here.")
@click.option("--overwrite", is_flag=True, help="Replace --output if it exists (atomically).")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "table"]), default=None)
@click.option("--as-of", "as_of", type=VERSION, default=None, help="Only row versions <= this (microseconds).")
@click.option("--limit", type=COUNT, default=20, show_default=True, help="Rows shown on stdout.")
@click.pass_obj
@_user_errors
def read(
    obj: Context,
    table: str,
    site: str | None,
    output: Path | None,
    overwrite: bool,
    fmt: str | None,
    as_of: int | None,
    limit: int,
) -> None:
    """Read a table's current rows (last writer wins, deletes applied) at a site.

    --output never replaces the catalog, the definitions, a file under a site root or the work directory,
    nor an existing file unless --overwrite is given."""
    from segrep.data.reader import read_table

    target, out_fmt = None, "table"
    if output is None:
        if fmt not in (None, "table"):
            raise SegrepError("--format parquet or csv needs --output FILE")
    else:
        out_fmt = fmt or _format_from_suffix(output, ("parquet", "csv"))
        if out_fmt == "table":
            raise SegrepError("--format table prints to stdout; drop --output")
        target = check_output(output, protected_paths(obj.catalog(), obj.defs_if_any()), overwrite=overwrite)
    rows = read_table(obj.catalog(), table, site, as_of=as_of)
    if target is None:
        shown = rows.slice(0, limit).to_pylist()
        click.echo(format_rows(rows.column_names, [list(r.values()) for r in shown]))
        click.echo(f"{rows.num_rows} row(s) in {table} at {site or 'the leaders'}")
        return
    atomic_write_table(rows, target, out_fmt)
    click.echo(f"wrote {rows.num_rows} row(s) of {table} at {site or 'the leaders'} to {output}")


@main.command()
@click.argument("table")
@click.option("--site", default=None, help="Only placements at this site.")
@click.option("--partition", "partition_id", type=PARTITION_ID, default=None, help="Only this partition.")
@click.pass_obj
@_user_errors
def segments(obj: Context, table: str, site: str | None, partition_id: int | None) -> None:
    """Each placement's segment chain: ids, bases, flags, sizes, versions and acks."""
    from segrep.cli.views import segment_listing

    click.echo(segment_listing(obj.catalog(), table, site, partition_id))


@main.command("bootstrap")
@click.argument("table")
@click.argument("site")
@click.option(
    "--mode",
    type=click.Choice(["auto", "adopt", "replace"]),
    default="auto",
    show_default=True,
    help="auto refuses a target that already holds data; adopt keeps it if equal to the source; "
    "replace moves it aside.",
)
@click.pass_obj
@_user_errors
def bootstrap_(obj: Context, table: str, site: str, mode: str) -> None:
    """Join SITE to TABLE as a replica (new site, or one out of retention); rounds then feed it."""
    from segrep.maintenance.bootstrap import bootstrap

    report = bootstrap(obj.catalog(), obj.defs, table, site, mode)
    click.echo("\n".join(report.lines()))


@main.command("compact")
@click.argument("table")
@click.option("--partition", "partitions", type=PARTITION_ID, multiple=True, help="Only these partitions (repeatable).")
@click.option("--force", is_flag=True, help="Compact every partition with a minor segment, ignoring thresholds.")
@click.pass_obj
@_user_errors
def compact_(obj: Context, table: str, partitions: tuple[int, ...], force: bool) -> None:
    """Fold each due partition's minor segments into a major segment at its leader (one Spark application)."""
    from segrep.maintenance.compaction import compact

    obj.defs.table(table)
    report = compact(obj.catalog(), obj.defs, table, partitions=list(partitions) or None, force=force)
    if not report.candidates:
        click.echo(f"{table}: no partition is due for compaction")
        return
    for c in report.candidates:
        click.echo(f"partition {c.partition_id}: {c.minors} minor segment(s), {c.minor_bytes:,} bytes ({c.reason})")
    dropped = ", ".join(f"{d.item}: {d.reason}" for d in report.commit.dropped) or "none"
    click.echo(f"committed {report.committed} major segment(s); dropped: {dropped}")
    for line in report.needs_bootstrap:
        click.echo(f"ALERT: {line}")
    if report.commit.invalid:
        failed = "; ".join(f"{p.item}: {p.reason}" for p in report.commit.invalid)
        _fail(f"compaction of {table} could not fold {len(report.commit.invalid)} partition(s): {failed}", 1)


@main.command("failover")
@click.argument("tables", nargs=-1, required=True)
@click.option("--to", "to", default=None, help="The site to promote. Default: the most advanced live replica.")
@click.option(
    "--at",
    "cut",
    type=click.Choice(["latest", "safe-time"]),
    default="latest",
    show_default=True,
    help="Which rows the new leader keeps: latest = everything it holds; safe-time = the rows as of the tables' "
    "smallest safe time at the new site, newer ones set aside in its rollback area.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what would be lost and set aside (with --at safe-time, the cut at the new leader too), per "
    "partition; change nothing.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
@_user_errors
def failover_(obj: Context, tables: tuple[str, ...], to: str | None, cut: str, dry_run: bool, as_json: bool) -> None:
    """Move the leadership of TABLES to another site (unplanned: the leader's site may be down).

    Per table, one transaction moves every partition's leader and raises its epoch, so a writer or round of
    the old leader can no longer commit. The loss (segments the new leader lacks) is printed first, exactly."""
    import json

    from segrep.failover.promote import Cut, failover

    report = failover(obj.catalog(), obj.defs, list(tables), to=to, cut=Cut(cut), dry_run=dry_run)
    click.echo(json.dumps(report.to_dict(), indent=2, default=str) if as_json else str(report))


@main.command("switchover")
@click.argument("tables", nargs=-1, required=True)
@click.option("--to", "to", required=True, help="The site that takes the lead.")
@click.option(
    "--timeout",
    default="10m",
    show_default=True,
    help="Give up (and resume writes) after this long; 0: do not wait, switch only if nothing is left to drain.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
@_user_errors
def switchover_(obj: Context, tables: tuple[str, ...], to: str, timeout: str, as_json: bool) -> None:
    """Planned move of TABLES' leadership to --to with nothing lost (RPO 0).

    Writes pause (writers get a clear, retryable error), rounds drain until the new leader holds every
    segment, the leaders move with an epoch bump, writes resume there; the old leader follows by
    fast-forward. On timeout or error writes resume at the old leader and nothing else changes."""
    import json

    from segrep.config.policy import parse_duration_s
    from segrep.failover.switchover import switchover

    seconds = parse_duration_s(timeout, "--timeout")
    report, drained = switchover(obj.catalog(), obj.defs, list(tables), to, timeout_s=seconds)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
        return
    for d in drained:
        click.echo(str(d))
    click.echo(str(report))


@main.group("rollback")
def rollback_group() -> None:
    """Rows a failed-over leader held that its successor lacked, set aside at its site when it returned."""


@rollback_group.command("list")
@click.argument("table", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the files and their manifests as JSON.")
@click.pass_obj
@_user_errors
def rollback_list(obj: Context, table: str | None, as_json: bool) -> None:
    """List the rollback files at every site (of TABLE): rows, epochs, version range, path.

    Re-apply rows on purpose with `segrep write TABLE FILE` (the file is Parquet with the table's columns)."""
    import json

    from segrep.replication.rollback import list_rollbacks

    files = list_rollbacks(obj.catalog(), table)
    if as_json:
        click.echo(json.dumps([f.to_dict() for f in files], indent=2))
        return
    if not files:
        click.echo("no rollback files")
        return
    rows = [
        [
            f.table,
            f.partition_id,
            f.site,
            f.failover_id,
            f.rows,
            ",".join(map(str, f.epochs)),
            "-" if f.min_version is None else hlc.iso(f.min_version),
            "-" if f.max_version is None else hlc.iso(f.max_version),
            f.relpath,
        ]
        for f in files
    ]
    headers = ["table", "partition", "site", "failover", "rows", "epochs", "oldest", "newest", "file"]
    click.echo(format_rows(headers, rows))


@rollback_group.command("drop")
@click.argument("table")
@click.option("--site", required=True, help="The site whose rollback files go.")
@click.option("--failover", "failover_id", type=FAILOVER_ID, default=None, help="Only the files of this failover.")
@click.pass_obj
@_user_errors
def rollback_drop(obj: Context, table: str, site: str, failover_id: int | None) -> None:
    """Delete TABLE's rollback files at SITE: the set-aside rows are gone for good."""
    from segrep.replication.rollback import drop_rollbacks

    gone = drop_rollbacks(obj.catalog(), table, site, failover_id)
    click.echo("\n".join(f"dropped {path}" for path in gone) or "no rollback file matched")


@main.command("gc")
@click.argument("table", required=False)
@click.option("--dry-run", is_flag=True, help="List each file that would go and why; change nothing.")
@click.pass_obj
@_user_errors
def gc_(obj: Context, table: str | None, dry_run: bool) -> None:
    """Delete segments no chain needs any more (with retention for offline replicas) and old orphan files."""
    from segrep.maintenance.gc import collect

    if table is not None:
        obj.defs.table(table)
    report = collect(obj.catalog(), obj.defs, table, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    for d in report.deletions:
        click.echo(f"{verb} {d.site}:{d.relpath}  ({d.reason})")
    for upload in report.uploads_aborted:
        verb_upload = "would abort" if dry_run else "aborted"
        click.echo(f"{verb_upload} the incomplete upload {upload}  (left by a killed copy or write)")
    for line in report.held:
        click.echo(f"held: {line}")
    for line in report.needs_bootstrap:
        click.echo(f"ALERT: {line}")
    files = len(report.deletions) if dry_run else report.files_removed
    click.echo(f"{verb} {len(report.deletions)} segment(s)/orphan(s); {files} file(s)")


def _parse_until(text: str | None) -> int | None:
    """``--until``: an ISO-8601 time (UTC if no zone) or integer microseconds since the epoch."""
    if text is None:
        return None
    if text.isdigit():
        if int(text) > INT64_MAX:
            raise SegrepError(f"--until {text} is beyond the largest time segrep stores (microseconds < 2**63)")
        return int(text)
    import pendulum

    try:
        parsed = pendulum.parse(text, tz="UTC")
    except (ValueError, pendulum.parsing.exceptions.ParserError):
        raise SegrepError(f"--until {text!r} is not an ISO-8601 time or microseconds since the epoch") from None
    return int(parsed.timestamp() * 1_000_000)  # type: ignore[union-attr]


@main.command("round")
@click.argument("table")
@click.option("--until", default=None, help="Replicate segments committed before this time (ISO-8601). Default: now.")
@click.option("--target", default=None, help="Only this target site.")
@click.option("--reoffer", is_flag=True, help="Offer every segment again, ignoring acks and back-off.")
@click.option("--json", "as_json", is_flag=True, help="Print the round report as JSON.")
@click.pass_obj
@_user_errors
def round_(obj: Context, table: str, until: str | None, target: str | None, reoffer: bool, as_json: bool) -> None:
    """Run one replication round for TABLE without Airflow: plan, fast-forward, merge, commit (the steps the
    replication DAG runs).

    Exits 1 if a target could not be reached, a file failed verification, a target backing off after
    failures was not tried while it lacks segments (``--reoffer`` tries it now), or a target ends behind the
    table's RPO (the others are still replicated; the report names each file and what to run)."""
    import json

    from segrep.replication.orchestrator import RoundSteps

    obj.defs.table(table)
    steps = RoundSteps(obj.catalog(), obj.defs, table)
    view = steps.run(_parse_until(until), target=target, reoffer=reoffer)
    report = view.report
    click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str) if as_json else str(report))
    failure = view.failure()
    if failure:
        _fail(failure, 1)


@main.command("split")
@click.argument("table")
@click.argument("partition", type=PARTITION_ID)
@click.option("--at", "split_keys", multiple=True, help="A split key (repeatable); omit to resume the split under way.")
@click.option("--async", "is_async", is_flag=True, help="Finalize at once; the data follows through UNLOAD.")
@click.option("--json", "as_json", is_flag=True, help="Print the split report as JSON.")
@click.pass_obj
@_user_errors
def split_(
    obj: Context, table: str, partition: int, split_keys: tuple[str, ...], is_async: bool, as_json: bool
) -> None:
    """Split PARTITION of TABLE at the --at keys while writes continue (see `segrep table describe` for ids).

    Rewrites the parent's segments for each child with Spark, finalizes, unloads what the children still
    lack from every parent replica, and retires the parent. Re-run it (with or without --at) to resume.
    Exits 1 if the split is still waiting for a parent replica to push (its site is down)."""
    import json

    from segrep.core.states import SplitState
    from segrep.split.progress import progress_text, split_progress
    from segrep.split.run import run_split

    obj.defs.table(table)
    report = run_split(obj.catalog(), obj.defs, table, partition, list(split_keys), is_async=is_async)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        for p in report.passes:
            plan = p.plan
            held = f"{plan.exists} already held"
            click.echo(f"{plan.phase} pass: {plan.rewrites} rewrite(s), {plan.merges} merge(s), {held}")
        click.echo(progress_text(split_progress(obj.catalog(), table, include_done=True)[-1:]))
    if report.state != SplitState.DONE and not report.finish.replicas_only:
        _fail(f"split {report.split_id} of {table} waits: {report.finish.waiting}; re-run to continue", 1)


BYTES_PER_SECOND = click.IntRange(min=0, max=MAX_SCRUB_BYTES_PER_S)


@main.command("verify")
@click.argument("table")
@click.option("--site", default=None, help="Only this site (its rows against the leaders'; its files).")
@click.option(
    "--at",
    "at",
    default=None,
    metavar="safe-time|VERSION",
    help="Compare rows as of this version (microseconds). Default: each replica site's safe time.",
)
@click.option("--files", is_flag=True, help="Also hash every segment file against the catalog (size, sha256).")
@click.option(
    "--max-bytes-per-second",
    "rate",
    type=BYTES_PER_SECOND,
    default=None,
    help="Pace the file scrub (0: unpaced). Default: $SEGREP_SCRUB_BYTES_PER_S or 64 MiB/s.",
)
@click.option(
    "--reader-site",
    "reader",
    default=None,
    help="The site this command runs at: with --files, other sites' files cross the links from them to it, "
    "at a scrub's share of a capped link (`links:` in the definitions). Default: $SEGREP_READER_SITE.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
@_user_errors
def verify_(
    obj: Context,
    table: str,
    site: str | None,
    at: str | None,
    files: bool,
    rate: int | None,
    reader: str | None,
    as_json: bool,
) -> None:
    """Compare every replica's rows with its leader's as of one pinned version, and with --files every file
    with the catalog. Exits 1 naming each differing key and bad file; 0 when all is equal."""
    import json

    from segrep.catalog.link_limits import definitions_limits, reader_site
    from segrep.maintenance.verify import parse_at, verify
    from segrep.maintenance.verify_spark import SparkDigests
    from segrep.spark import launch
    from segrep.storage.pacing import scrub_rate

    pin, pace = parse_at(at), scrub_rate(rate)
    spark = SparkDigests.for_table(obj.defs, table, launch.submit)
    reader = reader_site(obj.defs, reader)  # an unknown site is named before anything is read
    links = definitions_limits(obj.defs)
    report = verify(
        obj.catalog(), table, site=site, at=pin, files=files, rate=pace, spark=spark, reader=reader, links=links
    )
    click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True) if as_json else str(report))
    if report.differences:
        _fail(f"verify of {table}: {report.differences} difference(s); see above, then `segrep repair {table}`", 1)


@main.command("repair")
@click.argument("table")
@click.option("--site", default=None, help="Only mend copies and replicas at this site (sources may be anywhere).")
@click.option("--dry-run", is_flag=True, help="Say what would be mended; change nothing.")
@click.option(
    "--max-bytes-per-second",
    "rate",
    type=BYTES_PER_SECOND,
    default=None,
    help="Pace hashing (0: unpaced). Default: $SEGREP_SCRUB_BYTES_PER_S or 64 MiB/s.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
@_user_errors
def repair_(obj: Context, table: str, site: str | None, dry_run: bool, rate: int | None, as_json: bool) -> None:
    """Fetch missing or damaged segment files again from an intact copy (the leader's too), re-bootstrap
    replicas whose rows still differ, report segments intact nowhere as LOST (nothing is deleted).
    Exits 1 unless the table verifies clean afterwards (a dry run: unless there is nothing to do)."""
    import json

    from segrep.maintenance.repair import repair
    from segrep.storage.pacing import scrub_rate

    pace = scrub_rate(rate)
    obj.defs.table(table)
    report = repair(obj.catalog(), obj.defs, table, site=site, dry_run=dry_run, rate=pace)
    click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True) if as_json else str(report))
    if not report.clean:
        what = "has something to repair" if dry_run else "is not clean after repair"
        _fail(f"{table} {what}; see above", 1)


@main.command()
@click.argument("table", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
@_user_errors
def status(obj: Context, table: str | None, as_json: bool) -> None:
    """Per table and target site: safe time, lag, RPO, pending segments and bytes, last round, declines; the
    splits under way; the conflicts of active-active tables in the last 24 h; the links between the sites (the
    cap in force now, where it comes from, the copy limit, the next change)."""
    from segrep.cli.views import status_output

    click.echo(status_output(obj.catalog(), obj.defs_if_any(), table, as_json=as_json))


@main.command("publish")
@click.argument("table")
@click.option("--site", "sites", multiple=True, help="Only this site (repeatable). Default: every site of TABLE.")
@click.option("--json", "as_json", is_flag=True, help="Print each site's publication as JSON.")
@click.pass_obj
@_user_errors
def publish_(obj: Context, table: str, sites: tuple[str, ...], as_json: bool) -> None:
    """Publish TABLE's copy at each site as an Iceberg table now, if it moved since its last snapshot (every
    round, write, failover, compaction and split of a table with `policy: {publish: iceberg}` does it too).

    Each site's table is `<site>.<table>` in the SQL catalog `segrep` in the catalog database (docs/open-tables.md
    says how to point pyiceberg, Spark, Trino or DuckDB at it). Exits 1 if a site could not be published (its
    previous snapshot stays current), 2 if the table does not publish."""
    import dataclasses
    import json

    from segrep.publish.policy import enabled
    from segrep.replication.publication import publish

    obj.defs.table(table)
    for site in sites:
        obj.defs.site(site)
    if not enabled(obj.defs, table):
        _fail(f"table {table} is not published: its policy needs `publish: iceberg` ({obj.defs.path})", 2)
    pub = publish(obj.catalog(), obj.defs, table, list(sites) or None)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(pub), indent=2, sort_keys=True, default=str))
    else:
        for x in pub.sites:
            click.echo(f"{table}: {x.line()}")
    if pub.failed:
        _fail(f"{len(pub.failed)} site(s) not published: " + "; ".join(x.line() for x in pub.failed), 1)


@main.command("airflow-pools")
@click.option("--json", "as_json", is_flag=True, help="Print the file `airflow pools import` reads.")
@click.pass_obj
@_user_errors
def airflow_pools(obj: Context, as_json: bool) -> None:
    """The Airflow pools of the definitions' links: one per direction with max_concurrent_copies, whose slots
    cap the copy tasks crossing it. Reads only the definitions file. Load them with `segrep airflow-pools
    --json > pools.json && airflow pools import pools.json` (make airflow does it at every start)."""
    import json

    from segrep.config.link_pools import link_pools, pools_json

    if as_json:
        click.echo(json.dumps(pools_json(obj.defs), indent=2, sort_keys=True))
        return
    pools = link_pools(obj.defs)
    if not pools:
        click.echo(f"no link in {obj.defs.path} has max_concurrent_copies: no pool (copy tasks use default_pool)")
        return
    rows = [[p.name, p.slots, f"{p.source} -> {p.target}", p.link.pair] for p in pools]
    click.echo(format_rows(["pool", "slots", "copies", "link"], rows))


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)


def run() -> None:
    """Entry point that keeps unexpected errors to one line unless SEGREP_DEBUG is set.

    SIGTERM (a supervisor stopping us, Airflow killing a task) unwinds like Ctrl-C, so what the command
    started (a spark-submit and its JVM) is stopped on the way out rather than left running."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    hide_pandas()
    try:
        main(standalone_mode=True)
    except SystemExit:
        raise
    except OSError as exc:  # the machine, not the input: a full disk, a store that went away mid-command
        click.echo(f"segrep: error: {describe(exc)}", err=True)
        sys.exit(1)
    except Exception as exc:
        if os.environ.get("SEGREP_DEBUG"):
            raise
        click.echo(
            f"segrep: internal error: {type(exc).__name__}: {exc} (SEGREP_DEBUG=1 shows the traceback)", err=True
        )
        sys.exit(1)

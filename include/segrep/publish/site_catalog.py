"""The Iceberg catalog a site's published tables are registered in, and how to reach its files.

By default (``iceberg_catalog`` absent in the definitions) pyiceberg's SQL catalog in segrep's own metadata
database (its tables ``iceberg_tables`` and
``iceberg_namespace_properties`` beside segrep's), catalog name ``segrep``, one namespace per site: the table
``orders`` as published by site ``dr`` is ``dr.orders``. A site's file system properties (an S3 endpoint,
region, credentials) are given to the catalog object in memory only, for the site whose files it reads and
writes; the catalog database stores table names and metadata locations, never a credential.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass

from pyiceberg.catalog import Catalog as IcebergCatalog
from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.config import stores as config_stores
from segrep.config.iceberg_catalog import IcebergCatalogDef
from segrep.core.errors import SegrepError
from segrep.publish.site_io import local_io_properties
from segrep.storage.site import Site
from segrep.storage.stores import open_store, resolve_credentials

CATALOG_NAME = "segrep"
ICEBERG_DIR = "_iceberg"  # beside a table's partition directories: <root>/<table>/_iceberg/{metadata,deletes}
# engines whose catalog tables exist, with the layout pyiceberg found them in (its _schema_version)
_INITIALIZED: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class SiteLocation:
    """Where a site's files are, as Iceberg names them (``file:///...`` or ``s3://bucket/...``)."""

    site: str
    base: str  # the site root's URI, no trailing slash

    def file(self, relpath: str) -> str:
        return f"{self.base}/{relpath}"

    def table(self, table: str) -> str:
        return f"{self.base}/{table}/{ICEBERG_DIR}"


def site_location(site: Site) -> SiteLocation:
    base = site.root.rstrip("/")
    return SiteLocation(site.name, f"file://{base}" if site.local else f"s3://{base}")


def file_io_properties(site: str, uri: str) -> dict[str, str]:
    """pyiceberg FileIO properties for a site's store: for a local directory segrep's own FileIO (``site_io``:
    every file atomic and durable before the catalog names it); for S3 pyiceberg's, with the store's endpoint,
    region, addressing and (resolved now, kept in memory) credentials."""
    if not uri.lower().startswith("s3://"):
        return local_io_properties(open_store(site, uri).root)
    opts = config_stores.options_for(site, uri)
    props = {"s3.force-virtual-addressing": "false" if opts.path_style else "true"}
    if opts.endpoint is not None:
        props["s3.endpoint"] = opts.endpoint
    props["s3.region"] = opts.region or "us-east-1"
    if opts.credentials is not None:
        secrets = resolve_credentials(site, opts.credentials)
        props["s3.access-key-id"] = secrets.access_key
        props["s3.secret-access-key"] = secrets.secret_key
        if secrets.session_token is not None:
            props["s3.session-token"] = secrets.session_token
    return props


class _SegrepSqlCatalog(SqlCatalog):
    """pyiceberg's SQL catalog on segrep's own engine: no second connection pool to the catalog database
    (SQLite's lock waits and the PostgreSQL schema are segrep's), disposed with segrep's ``Catalog``."""

    def __init__(self, engine: Engine, **properties: str) -> None:
        MetastoreCatalog.__init__(self, CATALOG_NAME, **properties)
        self.engine = engine
        known = _INITIALIZED.get(engine)
        if known is None:  # its tables made (if missing) and probed once per engine, not per publication
            self._init_catalog()
            _INITIALIZED[engine] = self._schema_version
        else:
            self._schema_version = known

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        """pyiceberg's commit of an existing table without loading it again first: the publisher has just
        loaded ``table``, and the update is conditional on its metadata location, so a commit that raced
        another fails here as it would there (CommitFailedException; nothing becomes current). Whatever this
        shortcut does not cover (a table the catalog lacks, a database that cannot count updated rows) goes
        to pyiceberg's own."""
        if table.metadata_location is None or not self.engine.dialect.supports_sane_rowcount:
            return super().commit_table(table, requirements, updates)
        ident = table.name()
        space = IcebergCatalog.namespace_to_string(IcebergCatalog.namespace_from(ident))
        name = IcebergCatalog.table_name_from(ident)
        staged = self._update_and_stage_table(table, ident, requirements, updates)
        if staged.metadata == table.metadata:
            return CommitTableResponse(metadata=table.metadata, metadata_location=table.metadata_location)
        self._write_metadata(metadata=staged.metadata, io=staged.io, metadata_path=staged.metadata_location)
        with Session(self.engine) as session:
            changed = session.execute(
                update(IcebergTables)
                .where(
                    IcebergTables.catalog_name == self.name,
                    IcebergTables.table_namespace == space,
                    IcebergTables.table_name == name,
                    IcebergTables.metadata_location == table.metadata_location,
                )
                .values(metadata_location=staged.metadata_location, previous_metadata_location=table.metadata_location)
            )
            if changed.rowcount < 1:  # type: ignore[attr-defined]
                with contextlib.suppress(Exception):  # its unique name is listed nowhere: nothing else collects it
                    staged.io.delete(staged.metadata_location)
                raise CommitFailedException(f"Table has been updated by another process: {space}.{name}")
            session.commit()
        return CommitTableResponse(metadata=staged.metadata, metadata_location=staged.metadata_location)


def site_catalog(catalog: Catalog, site: str, uri: str, choice: IcebergCatalogDef | None = None) -> IcebergCatalog:
    """The Iceberg catalog through which ``site``'s tables are published, with that site's file system: the
    SQL catalog in segrep's database, or the REST service ``choice`` names (its token from the environment)."""
    props = file_io_properties(site, uri)
    if choice is None or not choice.is_rest:
        return _SegrepSqlCatalog(catalog.engine, uri=catalog.safe_url, **props)
    # pyiceberg's REST client (with requests) costs a publishing process 0.07 s to import: only for a REST catalog
    from pyiceberg.catalog.rest import RestCatalog

    assert choice.uri is not None
    rest = {"uri": choice.uri, **({"warehouse": choice.warehouse} if choice.warehouse else {})}
    if choice.token_env is not None:
        token = os.environ.get(choice.token_env)
        if not token:
            raise SegrepError(f"iceberg_catalog token_env: the environment variable {choice.token_env} is not set")
        rest["token"] = token
    return RestCatalog(CATALOG_NAME, **rest, **props)


def namespace(site: str) -> str:
    return site


def identifier(site: str, table: str) -> tuple[str, str]:
    return (namespace(site), table)

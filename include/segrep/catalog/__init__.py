"""The metadata database: models, migrations, connection and the queries the workflows share."""

from segrep.catalog.engine import Catalog, resolve_url

__all__ = ["Catalog", "resolve_url"]

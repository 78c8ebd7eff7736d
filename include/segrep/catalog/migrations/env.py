"""Alembic environment: runs on the connection segrep hands over (see segrep.catalog.migrate)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from segrep.catalog.models import Base

config = context.config
connection = config.attributes.get("connection")

if connection is None:  # `alembic` command line, for writing new revisions: -x url=sqlite:///...
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///:memory:")
    with create_engine(url).begin() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata, render_as_batch=True)
        context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    context.run_migrations()

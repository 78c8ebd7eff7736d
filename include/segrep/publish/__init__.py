"""Open tables: each site's copy of a table published as an Iceberg (format v2) table at its safe time.

The publication is metadata only: manifests over the segment files the site already holds (no file is copied
or rewritten, no path ever points at another site), position delete files that hide what the site's reads
hide (rows superseded under last-writer-wins, tombstones, rows outside a placement's key range), and a
snapshot whose summary carries the safe time, the round and the leader epoch. Each site's table is registered
in an Iceberg catalog (by default pyiceberg's SQL catalog in segrep's metadata database, namespace per site),
so after a failover the new leader's table is already there. DESIGN section 18.
"""

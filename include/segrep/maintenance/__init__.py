"""Bootstrap and join, compaction, garbage collection."""

"""Rows in and out: the writer, the reader, the Spark reader helper, demo data, output files."""

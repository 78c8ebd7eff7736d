"""The definitions file: sites, tables and their policies, parsed and validated."""

"""Partition splits (EventQL 3.8): start, copy and unload passes, finalize, finish."""

"""Replication rounds: offers, fast-forward, commit, safe time, status, a whole round."""

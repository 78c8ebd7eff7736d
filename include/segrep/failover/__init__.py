"""Leader moves: unplanned failover, planned switchover, and the old leader's return (DESIGN section 11)."""

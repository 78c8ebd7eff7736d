"""Pure building blocks with no I/O: chains, the protocol's decisions, clocks, ids, names, keys, schemas."""

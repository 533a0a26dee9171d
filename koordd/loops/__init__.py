"""koordd's control loops, one module each: pure functions of a Snapshot to Actions. Import koordd.core only."""

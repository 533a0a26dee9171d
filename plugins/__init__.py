"""koordd's control loops, one module each (installed as koordd.plugins)."""

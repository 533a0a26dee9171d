"""koordd's own control loops, each a plugin: one module per loop, a pure function of a Snapshot to Actions,
importing koordd.core only. Installed as the package `koordd_plugins` (this folder is plugins/ in the source
tree) and registered as entry points of the group `koordd.loops` in koordd's pyproject.toml, the way a third
party's loop is: koordd finds them through its metadata, never by importing this package (docs/plugins.md)."""

"""koordd: a node-local QoS daemon. Its layers, lowest first: core, kernel, backends, sensors | act | the loops
(plugins/, the package koordd_plugins, reached through entry points), runtime (docs/design.md, "Layout")."""

"""koordd: a node-local QoS daemon. Its layers, lowest first: core, kernel, sensors | loops | backends, act, runtime (docs/design.md, "Layout")."""

"""Acting on decisions: the actuator (one writer for every backend), the restore journal, the host owner lock and the guard of protected cgroups. Imports core, kernel and backends."""

// Constants koordd's BPF programs and its Python share: one file, so the two sides cannot drift.
// koordd/kernel/bpf_shared.py reads it at import: keep to `#define NAME <integer>` lines here.
#ifndef KOORDD_SHARED_H
#define KOORDD_SHARED_H

// koordd_sched.bpf.c: the values of its `classes` map (cgroup id -> class), written by koordd/kernel/sched_ext_scheduler.py.
#define CLASS_LS 1
#define CLASS_BE 2

// runq_latency.c: slots of its per-cgroup wait histogram (log2 µs: slot k holds waits of
// [2^(k-1), 2^k) µs, slot 0 under 1 µs), read by koordd/sensors/runq.py.
#define RUNQ_SLOTS 32

// app_latency.c: slots of its per-cgroup response-time histogram, in the same log2 µs layout, read by
// koordd/sensors/app_latency.py.
#define APP_SLOTS 32

#endif

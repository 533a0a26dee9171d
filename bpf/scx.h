// The few sched_ext declarations koordd_sched.bpf.c uses, written out instead of the kernel tree's
// tools/sched_ext headers (not packaged by Debian). Types come from vmlinux.h, generated from the
// kernel's BTF by scripts/build-bpf; the kfuncs are resolved by name against that BTF
// when the object is loaded (Linux 6.13+ names: scx_bpf_dsq_insert, scx_bpf_dsq_move_to_local).
#pragma once

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

// libbpf 1.1 (Debian bookworm) knows only "struct_ops/": sleepable ones (init) are flagged by the
// loader (koordd/kernel/sched_ext_scheduler.py) instead of the "struct_ops.s/" section newer libbpf reads.
#define BPF_STRUCT_OPS(name, args...) SEC("struct_ops/" #name) BPF_PROG(name, ##args)

s32 scx_bpf_create_dsq(u64 dsq_id, s32 node) __ksym;
s32 scx_bpf_select_cpu_dfl(struct task_struct *p, s32 prev_cpu, u64 wake_flags, bool *is_idle) __ksym;
s32 scx_bpf_pick_idle_cpu(const struct cpumask *cpus_allowed, u64 flags) __ksym;
void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice, u64 enq_flags) __ksym;
void scx_bpf_dsq_insert_vtime(struct task_struct *p, u64 dsq_id, u64 slice, u64 vtime, u64 enq_flags) __ksym;
bool scx_bpf_dsq_move_to_local(u64 dsq_id) __ksym;
s32 scx_bpf_dsq_nr_queued(u64 dsq_id) __ksym;
void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
u32 scx_bpf_nr_cpu_ids(void) __ksym;
bool bpf_cpumask_test_cpu(u32 cpu, const struct cpumask *cpumask) __ksym;
// Open-coded iterator over a queue's threads (6.12+): the first is all koordd_sched.bpf.c looks at.
int bpf_iter_scx_dsq_new(struct bpf_iter_scx_dsq *it, u64 dsq_id, u64 flags) __ksym;
struct task_struct *bpf_iter_scx_dsq_next(struct bpf_iter_scx_dsq *it) __ksym;
void bpf_iter_scx_dsq_destroy(struct bpf_iter_scx_dsq *it) __ksym;

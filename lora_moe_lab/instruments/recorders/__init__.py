"""Recorders: what measures on a device or drives a run (timers, sync counters and checks, the audit,
profiler recording, sweeps, prefill, the recording harness). They may import analysers/, never the
reverse."""

"""Instruments: sync counting and checked regions (syncs), the sync check with an allowlist
(sync_check), the device timer (timing), profiler traces (trace) and their idle-time breakdown and
before/after diff (idle), the canonical guards recording (recordings), benchmark sweeps and their
CLI (bench), the chunked-prefill driver (prefill), the fused kernel's early exits (early_exit),
the CLIs' argument types and progress bars (cli)."""

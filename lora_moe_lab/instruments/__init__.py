"""Instruments: sync counting and checked regions (syncs), the device timer (timing), profiler
traces (trace), benchmark sweeps and their CLI (bench), the fused kernel's early exits (early_exit)."""

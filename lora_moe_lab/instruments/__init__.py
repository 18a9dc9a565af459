"""Instruments, in two halves (as HTA splits trace parsing and analyses from collecting traces):

recorders/  what measures on a device or drives a run: sync counting and checked regions (syncs), the
            sync check (sync_check), the sync audit (audit), the device timer (timing), torch-profiler
            recording (profiling), benchmark sweeps (bench), chunked prefill (prefill), the recording
            scripts' harness (harness), the clock log (clocks), the kernel cases (kernel_cases), the
            fused kernel's early exits (early_exit), the hidden-sync patterns (hidden_syncs), the CLIs'
            argument types (cli)
analysers/  what reads recordings and traces and computes: profiler traces (trace: parse, analysis,
            export), the idle breakdown (idle), the per-sync signature (signature), intervals and drift
            (stats), the canonical recordings (recordings), the recorded sessions (production_runs,
            hidden_sync_runs)

Recorders may import analysers; analysers never import recorders (tests/test_architecture.py)."""

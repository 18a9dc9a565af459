"""Analysers: what reads recordings and profiler traces and computes (trace parsing, analysis and export;
idle breakdown, per-sync signature, statistics, the canonical recordings and sessions). They never import
recorders/."""

"""A clock and power log of the card while a recording runs (read only: nvidia-smi's query loop).

    clocks = ClockLog(work / "clocks.csv")   # a sample every 100 ms, stamped with time.time()
    ...                                      # the rows' `t_unix` join each prefill to its samples
    clocks.close()

It answers "did the same kernels run at other clocks under `sync` than under `cpu_flag`?" with a
reading: under a power cap (the H200's 700 W) a GPU that idles in bubbles runs its kernels at a
higher clock than one that is never idle. Without nvidia-smi it records nothing (and writes no file).

Each sample is appended as one whole row (tables.append_rows: one write + fsync, the tail checked
first), so a run killed mid-sample leaves whole rows only; the file is created at its first sample.
The session's meta.json seals it once the log is closed (schemas kind "clocks").
"""
from __future__ import annotations

import time
from pathlib import Path


class ClockLog:
    """Samples the card every 100 ms while the tasks run (read only: nvidia-smi's query loop),
    each line stamped on arrival with time.time(), the clock the rows' `t_unix` use. It answers
    "did the same kernels run at other clocks under `sync` than under `cpu_flag`?" with a reading."""

    FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu"  # + the reason clocks are held down
    COLUMNS = ["t_unix", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle"]

    def __init__(self, path: Path):
        import shutil
        import subprocess
        import threading

        self.path, self.proc = path, None
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        fields = self.FIELDS
        for reason in ("clocks_event_reasons.active", "clocks_throttle_reasons.active", ""):
            fields = self.FIELDS + ("," + reason if reason else ",temperature.gpu")  # keep 5 columns
            if subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True).returncode == 0:
                break
        self.proc = subprocess.Popen([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "100"],
                                     stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.append(time.time(), line)

    def append(self, t: float, line: str) -> None:
        """One sample (nvidia-smi's csv line, stamped `t`) as one whole row of the log."""
        from .tables import append_rows

        vals = [f"{t:.3f}"] + [v.strip() for v in line.strip().split(",")]
        append_rows(self.path, [dict(zip(self.COLUMNS, vals))], self.COLUMNS, seal_it=False)

    def close(self):
        if self.proc is not None:
            self.proc.terminate()
            self.thread.join(timeout=2)

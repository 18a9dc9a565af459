"""`make run` / `make lab`: execute every notebook headless with papermill on the detected device
into build/ (plus an offline HTML report), or start JupyterLab on loopback with a token.

    python -m lora_moe_lab.nb.runner --out build                   # all notebooks, params by device
    python -m lora_moe_lab.nb.runner --only 01 --params ci         # one notebook, CI parameters
    python -m lora_moe_lab.nb.runner --out build --keep-going      # run all, report failures at the end
    python -m lora_moe_lab.nb.runner --lab --port 8888

Each executed notebook records where and when it ran (its metadata `lora_moe_lab`: device, parameter
set, commit; papermill's own start time and duration), and `run.json` beside them lists every
notebook's status, seconds and size. The report (`html/index.html`) says what each notebook shows,
on which device it ran and when; no page loads anything from the network.

Kernels run over IPC (local sockets), not TCP: ipykernel warns "Kernel is running over TCP without
encryption" for every TCP kernel, a warning about traffic that never leaves this machine here. The sockets
live in a private temporary folder of each process: jupyter_client's default, `kernel-ipc-N` in the working
directory (notebooks/ for every run), picks N by which files exist, so two runs at once (two `make run`, or
pytest-xdist workers) could take the same socket and a kernel would fail to start.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import secrets
import sys
import time
from pathlib import Path

import yaml

from ..provenance import ROOT

NB_DIR = ROOT / "notebooks"
TEMPLATES = Path(__file__).resolve().parent / "templates"
NB_LIMIT_BYTES = 1_000_000  # the rule for an executed notebook (tests/nb/test_notebooks.py checks it in CI)


def notebooks(only: list[str] | None = None) -> list[Path]:
    nbs = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        nbs = [p for p in nbs if any(p.name.startswith(o) for o in only)]
        if not nbs:
            raise SystemExit(f"no notebook matches {only}; have {[p.name for p in sorted(NB_DIR.glob('*.ipynb'))]}")
    return nbs


def resolve_kind(kind: str) -> str:
    if kind == "auto":
        from .. import runtime
        return "gpu" if runtime.has_cuda() else "ci"
    return kind


def params_for(kind: str) -> dict:
    path = NB_DIR / "params" / f"{resolve_kind(kind)}.yaml"
    if not path.exists():
        raise SystemExit(f"no parameter file {path}")
    return yaml.safe_load(path.read_text()) or {}


_IPC_DIR: str | None = None


def kernel_config():
    """papermill's kernel manager over IPC, its sockets in this process's own folder (module docstring)."""
    import tempfile

    from traitlets.config import Config

    global _IPC_DIR
    if _IPC_DIR is None:
        import atexit
        import shutil

        _IPC_DIR = tempfile.mkdtemp(prefix="lml-kernel-")  # short: a socket path is limited to ~107 bytes
        atexit.register(shutil.rmtree, _IPC_DIR, True)  # the folder goes with the process (ignore_errors)
    c = Config()
    c.KernelManager.transport = "ipc"
    c.KernelManager.ip = os.path.join(_IPC_DIR, "ipc")
    return c


def device_name() -> str:
    from .. import runtime

    if runtime.has_cuda():
        import torch
        return torch.cuda.get_device_name(0)
    return "CPU (no GPU: GPU sections show recorded H200 data)"


def execute(nb: Path, out_dir: Path, params: dict, timeout: int = 1800, kind: str = "") -> Path:
    """Execute one notebook into out_dir with papermill; the executed copy (written also when a
    cell fails) gets metadata `lora_moe_lab`: device, parameter set, commit."""
    import nbformat
    import papermill as pm

    from ..provenance import metadata

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / nb.name
    run = dict(device=device_name(), params=kind or "given", commit=metadata().get("commit", ""))
    try:
        pm.execute_notebook(str(nb), str(out), parameters=params, cwd=str(NB_DIR), kernel_name="python3",
                            progress_bar=False, execution_timeout=timeout, log_output=False, config=kernel_config())
    finally:
        if out.exists():
            done = nbformat.read(str(out), as_version=4)
            done.metadata["lora_moe_lab"] = run
            nbformat.write(done, str(out))
    return out


PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("<p><i>An interactive panel: it runs in JupyterLab (<code>make lab</code>). This offline page "
               "shows its static snapshot instead: the figures the notebook draws at its end.</i></p>")


def _offline_copy(nb):
    """A copy of the notebook for the offline page: plotly outputs also carry an HTML rendering that
    draws the figure with the page's local plotly.js (nbconvert's HTML does not render the plotly
    mimetype); a live widget view (which needs the widget renderer from a CDN) becomes a note."""
    import copy

    import plotly.io as pio

    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            fig = data.get(PLOTLY_MIME)
            if fig is not None:
                data["text/html"] = pio.to_html(dict(fig), include_plotlyjs=False, full_html=False, validate=False)
            if WIDGET_MIME in data:
                out["data"] = {"text/html": WIDGET_NOTE}
    return nb


def describe(nb) -> tuple[str, str]:
    """(title, what it shows): the first heading and the **Goal.** paragraph of the first markdown cell."""
    md = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    title = next((l.lstrip("# ").strip() for l in md.splitlines() if l.startswith("#")), "")
    goal = re.search(r"\*\*Goal\.\*\*\s*(.+?)(?:\n\s*\n|$)", md, re.S)
    return title, " ".join(goal.group(1).split()) if goal else ""


def _inline_md(text: str) -> str:
    """Escaped text with markdown's inline `code`, **bold** and *italics* as HTML."""
    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    t = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)
    return re.sub(r"(?<![*\w])\*([^*\s][^*]*?)\*(?![*\w])", r"<i>\1</i>", t)


def _when(nb) -> tuple[str, str]:
    pm_ = nb.metadata.get("papermill", {})
    start = str(pm_.get("start_time") or "")[:19].replace("T", " ")
    dur = pm_.get("duration")
    return (start + " UTC" if start else "?"), (f"{dur:.0f} s" if isinstance(dur, (int, float)) else "?")


def _status(nb) -> str:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"FAILED: {out.get('ename', '')}: {str(out.get('evalue', ''))[:200]}"
    return "ran to the end"


def html_report(executed: list[Path], out_dir: Path) -> Path:
    """One HTML page per notebook + an index, all reading ONE local copy of plotly.js that sits
    beside them; nothing is loaded from the network (templates/offline: no require.js, MathJax,
    mermaid or widget renderer from a CDN)."""
    import nbformat
    import plotly
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="offline", extra_template_basedirs=[str(TEMPLATES)])
    exporter.exclude_input_prompt = True
    html_dir = out_dir / "html"
    html_dir.mkdir(parents=True, exist_ok=True)
    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    (html_dir / "plotly.min.js").write_bytes(js.read_bytes())
    rows = []
    for p in executed:
        nb = nbformat.read(str(p), as_version=4)
        body, _ = exporter.from_notebook_node(_offline_copy(nb))
        (html_dir / (p.stem + ".html")).write_text(body)
        title, goal = describe(nb)
        run = nb.metadata.get("lora_moe_lab", {})
        start, dur = _when(nb)
        e = html.escape
        rows.append(f"<tr><td><a href='{e(p.stem)}.html'>{e(title or p.stem)}</a></td><td>{_inline_md(goal)}</td>"
                    f"<td>{e(run.get('device', 'unknown (not run by nb/runner.py)'))}</td>"
                    f"<td>{e(run.get('params', '?'))}</td><td>{e(start)}</td>"
                    f"<td>{e(dur)}</td><td>{e(_status(nb))}</td></tr>")
    index = html_dir / "index.html"
    index.write_text(
        "<!doctype html><meta charset='utf-8'><title>lora_moe_lab report</title>"
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}td,th{border-bottom:1px solid #ddd;"
        "padding:6px;vertical-align:top;text-align:left}</style>"
        "<h1>lora_moe_lab: executed notebooks</h1>"
        "<p>Each notebook ran headless with papermill; the device is the machine it ran on (without a GPU, the "
        "GPU sections show data recorded on an H200 and say so). Every page reads the local "
        "<code>plotly.min.js</code> beside it and loads nothing from the network.</p>"
        "<table><tr><th>notebook</th><th>what it shows</th><th>device</th><th>parameters</th><th>started</th>"
        "<th>took</th><th>status</th></tr>" + "".join(rows) + "</table>"
        f"<p>Report written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>")
    return index


class LabLaunchError(RuntimeError):
    """JupyterLab could not be started as asked (`make lab`): the message says why."""


class PortInUseError(LabLaunchError):
    """The asked port is taken on 127.0.0.1. The launcher never moves to another port: it would print a URL
    (with the token) for a port that another program answers."""


LAB_HOST = "127.0.0.1"


def check_port(port) -> int:
    """The port as an int in 1..65535; ValueError naming it otherwise (0 would let the OS pick one)."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"bad --port {port!r}: JupyterLab's port must be an int in 1..65535")
    return port


def accepts(port: int, host: str = LAB_HOST) -> bool:
    """Whether something listening on host:port takes a TCP connection now."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def port_is_free(port: int, host: str = LAB_HOST) -> bool:
    """Whether a listener can bind host:port now (the way Jupyter will bind it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def lab_command(port: int, root_dir: Path | str = NB_DIR) -> list[str]:
    """JupyterLab's command line. No token in it: every local user reads a process's arguments (`ps`); the token
    goes in the environment (`lab_env`), which only this user can read. `port_retries=0`: a busy port fails
    instead of moving to the next one."""
    return [sys.executable, "-m", "jupyterlab", f"--ip={LAB_HOST}", f"--port={check_port(port)}", "--no-browser",
            "--allow-root", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root_dir}"]


def lab_env(token: str, base: dict | None = None) -> dict:
    """The environment of the JupyterLab process: `base` (default: this process's) with JUPYTER_TOKEN, which
    jupyter_server's IdentityProvider reads as its token."""
    if not isinstance(token, str) or not token:
        raise ValueError("the JupyterLab token must be a non-empty string")
    env = dict(os.environ if base is None else base)
    env.pop("JUPYTER_TOKEN_FILE", None)
    env["JUPYTER_TOKEN"] = token
    return env


def server_info(pid: int, runtime_dir: Path | str) -> dict | None:
    """The runtime info jupyter_server writes once it listens (`jpserver-<pid>.json`: url, port, ...), or None."""
    f = Path(runtime_dir) / f"jpserver-{pid}.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):  # not written yet, or half written
        return None


def lab_url(info: dict, token: str) -> str:
    """The URL of the server that `info` (its runtime info) describes: the port it actually bound."""
    base = "/" + str(info.get("base_url", "/")).strip("/")
    return f"http://{LAB_HOST}:{info['port']}{base.rstrip('/')}/lab?token={token}"


def _relay(stream, keep, echo) -> None:
    """Jupyter's log, line by line: the last lines kept for an error message, each passed on to `echo`."""
    for line in stream:
        keep.append(line)
        if echo is not None:
            echo.write(line)
            echo.flush()


def start_lab(port: int, token: str | None = None, *, env: dict | None = None, timeout: float = 120.0,
              root_dir: Path | str = NB_DIR, log=sys.stderr):
    """Start JupyterLab on 127.0.0.1:`port`; returns (process, runtime info, token) once the server listens.
    Raises ValueError for a port outside 1..65535, PortInUseError when the port is taken (checked before the
    start, and from Jupyter's exit when another program took it meanwhile), LabLaunchError when Jupyter exits or
    does not come up in `timeout` seconds. Prints no URL (the caller prints `lab_url(info, token)`); Jupyter's
    own log goes to `log` (None: dropped)."""
    import collections
    import subprocess
    import threading

    from jupyter_core.paths import jupyter_runtime_dir

    check_port(port)
    if not port_is_free(port):
        raise PortInUseError(f"port {port} on {LAB_HOST} is in use: JupyterLab was not started; free it or pick "
                             f"another port (make lab PORT=8899, or --port 8899)")
    token = token or os.environ.get("LAB_TOKEN") or secrets.token_hex(16)
    env = lab_env(token, env)
    # where the server writes jpserver-<pid>.json: set for the child, so both sides agree (the default dir, where
    # `jupyter server list` looks, unless the environment names another)
    runtime_dir = env.setdefault("JUPYTER_RUNTIME_DIR", jupyter_runtime_dir())
    proc = subprocess.Popen(lab_command(port, root_dir), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    tail = collections.deque(maxlen=40)
    relay = threading.Thread(target=_relay, args=(proc.stderr, tail, log), daemon=True)
    relay.start()  # read from the start: a full pipe would stall the server
    deadline = time.monotonic() + timeout
    while True:
        info = server_info(proc.pid, runtime_dir)
        # listening: its runtime info written AND the port taking connections (the file can come first)
        if info is not None and "port" in info and (int(info["port"]) != port or accepts(port)):
            break
        if proc.poll() is not None:
            relay.join(5)
            said = "".join(tail).strip()
            last = "\n".join(said.splitlines()[-5:])
            if "already in use" in said or "is not available" in said:
                raise PortInUseError(f"port {port} on {LAB_HOST} was taken before JupyterLab could bind it (it exited "
                                     f"with {proc.returncode}); free it or pick another port. Jupyter said:\n{last}")
            raise LabLaunchError(f"JupyterLab exited with {proc.returncode} before it listened on port {port}. "
                                 f"Jupyter said:\n{last}")
        if time.monotonic() > deadline:
            proc.terminate()
            proc.wait(10)
            raise LabLaunchError(f"JupyterLab did not listen on port {port} within {timeout:.0f} s; stopped it")
        time.sleep(0.1)
    if int(info["port"]) != port:  # port_retries=0 rules this out; never print the URL of a port not asked for
        proc.terminate()
        proc.wait(10)
        raise LabLaunchError(f"JupyterLab bound port {info['port']}, not the asked {port}; stopped it")
    return proc, info, token


def stop_lab(proc, grace: float = 10.0) -> None:
    """Stop JupyterLab: SIGTERM (it shuts its kernels down and exits), SIGKILL after `grace` seconds."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def lab(port: int, token: str | None = None) -> int:
    """`make lab`: start JupyterLab, print the URL of the port it bound (read from its runtime info) once it
    listens, and wait for it; returns its exit status. SIGTERM or SIGINT to this launcher stops JupyterLab too
    (a launcher killed alone would leave the server serving with the token it printed), then exits 128 + the
    signal's number."""
    import signal

    proc, info, token = start_lab(port, token)

    def on_signal(signum, _frame):  # unwinds the wait below; `finally` stops the server (not here: this handler
        raise SystemExit(128 + signum)  # may run inside proc.wait(), which holds the lock a second wait needs)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        print(f"JupyterLab: {lab_url(info, token)}", flush=True)
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stop_lab(proc)  # whatever ended the wait: the server does not outlive its launcher


def run_all(nbs: list[Path], out: Path, kind: str, keep_going: bool = False, on_each=None) -> list[dict]:
    """Execute the notebooks in turn; one record each (name, status, seconds, bytes, device, error),
    also written to out/run.json. Without keep_going the first failure raises. on_each(records), when
    given, runs after every notebook (the GPU check writes its log there: a run cut short keeps what ran)."""
    params = params_for(kind)
    kind = resolve_kind(kind)
    records = []
    for nb in nbs:
        t0 = time.time()
        print(f"running {nb.name} with the {kind} parameters ...", flush=True)
        rec = dict(notebook=nb.stem, params=kind, device=device_name(), status="passed", error="")
        try:
            execute(nb, out, params.get(nb.stem, {}), kind=kind)
        except Exception as e:  # noqa: BLE001 - recorded, then re-raised unless keep_going
            rec.update(status="failed",
                       error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}")
            if not keep_going:
                raise
        finally:
            f = out / nb.name
            rec.update(seconds=round(time.time() - t0, 1), bytes=f.stat().st_size if f.exists() else 0)
            records.append(rec)
            (out / "run.json").write_text(json.dumps(records, indent=1))
        big = " (over the 1 MB rule)" if rec["bytes"] > NB_LIMIT_BYTES else ""
        print(f"  {rec['status']} in {rec['seconds']:.1f} s, {rec['bytes'] / 1e3:.0f} kB{big} -> {out / nb.name}"
              + (f"\n  {rec['error']}" if rec["error"] else ""), flush=True)
        if on_each is not None:
            on_each(records)
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build", help="folder for executed notebooks and the HTML report (default: build)")
    ap.add_argument("--params", default="auto",
                    help="parameter set: auto (gpu when CUDA, else ci), ci, gpu (default: auto)")
    ap.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 01 03 (default: all)")
    ap.add_argument("--keep-going", action="store_true",
                    help="run every notebook even after a failure; exit 1 at the end")
    ap.add_argument("--no-html", action="store_true", help="skip the HTML report")
    ap.add_argument("--lab", action="store_true", help="start JupyterLab instead")
    ap.add_argument("--port", type=int, default=8888, help="JupyterLab's port (default: 8888)")
    a = ap.parse_args(argv)
    if a.lab:
        try:
            return lab(a.port)
        except (ValueError, LabLaunchError) as e:
            print(f"make lab: {e}", file=sys.stderr, flush=True)
            return 2
    out = Path(a.out).resolve()
    nbs = notebooks(a.only)
    records = run_all(nbs, out, a.params, keep_going=a.keep_going)
    if not a.no_html:
        print(f"HTML report: {html_report([out / nb.name for nb in nbs if (out / nb.name).exists()], out)}")
    failed = [r["notebook"] for r in records if r["status"] != "passed"]
    if failed:
        print(f"{len(failed)} of {len(records)} notebooks failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

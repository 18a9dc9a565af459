"""Notebook 04 in a real browser: JupyterLab on loopback, headless Chromium through Playwright.

Starts JupyterLab (token, free port, a temporary copy of notebooks/), opens notebook 04, runs all
cells, waits for the panel's plotly figure, moves two controls (the guard dropdown and the tokens
slider) and checks that the figure was redrawn with the new selection, presses Run (a background
thread) and waits for the results table to grow; saves a screenshot to
build/browser_04.png. The server is always shut down (API shutdown, then terminate, then kill).

Needs /usr/bin/chromium (never downloads a browser) and the playwright package; skipped with the
reason otherwise.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
NB = "04_live_microbenchmarks.ipynb"
SHOT = ROOT / "build" / "browser_04.png"

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def _need():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} not found (CI installs the Debian chromium package)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install playwright; no browser download needed)")
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        pytest.skip("jupyterlab is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


class Lab:
    """A JupyterLab server on 127.0.0.1 serving a temporary copy of the notebooks."""

    def __init__(self, tmp: Path):
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.root = tmp / "notebooks"
        shutil.copytree(ROOT / "notebooks", self.root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                         ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
            env[var] = str(tmp / "jupyter" / sub)
        # no announcements / update pop-ups over the notebook
        settings = tmp / "jupyter" / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        self.log = open(tmp / "lab.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={self.root}", "--LabApp.expose_app_in_browser=True",
             "--ServerApp.disable_check_xsrf=False"],
            cwd=str(tmp), env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 90.0) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                status, _ = _get(f"{self.base}/api/status?token={self.token}", timeout=2)
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer on port {self.port} within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        try:
            return Path(self.log.name).read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:  # clean shutdown: the server stops its kernels too
                req = urllib.request.Request(f"{self.base}/api/shutdown?token={self.token}", method="POST")
                urllib.request.urlopen(req, timeout=5).close()
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        self.log.close()


# The panel's view figure lives in an ipywidgets Output; its title names the selection.
VIEW_TITLE = ".widget-output .js-plotly-plot .gtitle"
TITLE_JS = f"() => {{ const t = document.querySelector({json.dumps(VIEW_TITLE)}); return t ? t.textContent : null; }}"


def test_notebook_04_in_jupyterlab(tmp_path):
    _need()
    from playwright.sync_api import sync_playwright

    lab = Lab(tmp_path)
    browser = None
    try:
        lab.wait_ready()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab.base}/lab/tree/{NB}?token={lab.token}", wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=90_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
                                   "&& window.jupyterapp.shell.currentWidget.sessionContext "
                                   "&& window.jupyterapp.shell.currentWidget.sessionContext.session "
                                   "&& window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
                                   timeout=90_000)
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.ready")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # the panel's figure renders (plotly draws its SVG title) with the notebook's parameters
            page.wait_for_function(f"() => {{ const t = ({TITLE_JS})(); return t && t.includes(' sync at M='); }}",
                                   timeout=120_000)
            before = page.evaluate(TITLE_JS)
            m = int(re.search(r"at M=(\d+)", before).group(1))
            n_traces_before = page.evaluate(
                "() => document.querySelector('.widget-output .js-plotly-plot').data.length")
            # every cell ran without an error output
            page.wait_for_function("() => { const a = window.jupyterapp.shell.currentWidget.content.widgets;"
                                   " return a.every(c => c.model.type !== 'code' || c.model.executionCount !== null);"
                                   " }",
                                   timeout=120_000)
            failed = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                                  has_text="Error")
            assert failed.count() == 0, "a cell failed:\n" + failed.first.inner_text()[-3000:]

            # move a control: the guard dropdown -> the view is redrawn for cpu_flag
            guard = page.locator(".widget-dropdown", has=page.locator("label", has_text="guard")).locator("select")
            guard.select_option("cpu_flag")
            page.wait_for_function(f"() => {{ const t = ({TITLE_JS})(); "
                                   f"return t && t.includes('cpu_flag at M={m}'); }}",
                                   timeout=60_000)
            after_guard = page.evaluate(TITLE_JS)
            assert after_guard != before, (before, after_guard)

            # and the tokens slider (keyboard on its handle): one step up, M -> 2M
            handle = page.locator(".widget-slider", has=page.locator("label", has_text="tokens (M)")) \
                .locator(".noUi-handle")
            handle.focus()
            handle.press("ArrowRight")
            page.wait_for_function(f"() => {{ const t = ({TITLE_JS})(); "
                                   f"return t && t.includes('cpu_flag at M={2 * m}'); }}",
                                   timeout=60_000)
            after_tokens = page.evaluate(TITLE_JS)
            n_traces_after = page.evaluate("() => document.querySelector('.widget-output .js-plotly-plot').data.length")
            assert n_traces_after >= 4 and n_traces_before >= 4  # three guard lines + the selected point

            # press Run: it runs on a thread and appends rows to the results table (3 -> 6 rows here)
            rows_js = ("() => { const t = document.querySelectorAll('.widget-output table.dataframe tbody tr');"
                       " return t.length; }")
            n_rows = page.evaluate(rows_js)
            page.locator("button.jupyter-button", has_text="Run").first.click()
            page.wait_for_function(f"() => ({rows_js})() > {n_rows}", timeout=60_000)
            page.wait_for_function("() => { const b = [...document.querySelectorAll('button.jupyter-button')]"
                                   ".find(b => b.textContent.trim() === 'Run'); return b && !b.disabled; }",
                                   timeout=60_000)

            SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOT), full_page=False)
            assert SHOT.stat().st_size > 10_000
            assert not [e for e in errors if "plotly" in e.lower()], errors
            print(f"\nbefore: {before}\nguard : {after_guard}\ntokens: {after_tokens}\nscreenshot: {SHOT}")
            browser.close()
            browser = None
    except Exception:
        print("---- JupyterLab log (tail) ----\n" + lab.tail())
        raise
    finally:
        if browser is not None:
            try:
                browser.close()
            except Exception:  # noqa: BLE001 - the server must still be stopped
                pass
        lab.stop()

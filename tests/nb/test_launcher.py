"""The JupyterLab launcher (`make lab`, nb/runner.py): the token travels in the environment, not in the process
arguments every local user can read; a busy port fails with a clear message and no URL; the port is range-checked;
the URL printed is the one of the port the server bound (its runtime info)."""
import importlib.util
import json
import socket
import urllib.error
import urllib.request

import pytest

from lora_moe_lab.nb import runner

TOKEN = "0123456789abcdef-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NEEDS_LAB = pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None,
                               reason="starts JupyterLab: not installed (the GPU machine: notebook runners only)")


@pytest.fixture
def busy_port():
    """A port a dummy listener holds for the test."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_token_is_not_in_the_command_line():
    cmd = runner.lab_command(8888)
    assert not any(TOKEN in a or "token" in a.lower() for a in cmd), cmd
    assert "--ip=127.0.0.1" in cmd and "--port=8888" in cmd and "--ServerApp.port_retries=0" in cmd


def test_token_is_in_the_environment():
    env = runner.lab_env(TOKEN, {"PATH": "/bin", "JUPYTER_TOKEN_FILE": "/tmp/x"})
    assert env["JUPYTER_TOKEN"] == TOKEN and env["PATH"] == "/bin" and "JUPYTER_TOKEN_FILE" not in env


@pytest.mark.parametrize("token", ["", None, 123])
def test_empty_token_is_refused(token):
    with pytest.raises(ValueError, match="token"):
        runner.lab_env(token)


@pytest.mark.parametrize("port", [0, -1, -8888, 65536, 70000, True, False, 8888.0, "8888", None])
def test_port_out_of_range_is_named(port):
    with pytest.raises(ValueError, match=r"--port .*1\.\.65535"):
        runner.check_port(port)
    with pytest.raises(ValueError, match="--port"):
        runner.lab_command(port)


@pytest.mark.parametrize("port", [1, 8888, 65535])
def test_ports_in_range_pass(port):
    assert runner.check_port(port) == port


@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_cli_port_out_of_range_fails_without_url(port, capsys):
    assert runner.main(["--lab", "--port", port]) != 0
    out, err = capsys.readouterr()
    assert f"--port {int(port)}" in err and "1..65535" in err
    assert "token=" not in out + err


def test_busy_port_fails_clearly_before_jupyter_starts(busy_port, capsys, monkeypatch):
    started = []
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: started.append(a))  # must not be reached
    with pytest.raises(runner.PortInUseError, match=f"port {busy_port} on 127.0.0.1 is in use"):
        runner.start_lab(busy_port, TOKEN)
    assert runner.main(["--lab", "--port", str(busy_port)]) != 0
    out, err = capsys.readouterr()
    assert f"port {busy_port}" in err and "in use" in err
    assert "token=" not in out + err and TOKEN not in out + err and not started


@NEEDS_LAB
def test_port_taken_after_the_check_is_reported_from_jupyters_exit(busy_port, monkeypatch, capfd):
    """Another program takes the port between the check and Jupyter's bind: with port_retries=0 Jupyter exits
    (it does not move to the next port), and the launcher says so and prints no URL."""
    monkeypatch.setattr(runner, "port_is_free", lambda port, host="127.0.0.1": True)
    with pytest.raises(runner.PortInUseError, match=f"port {busy_port} on 127.0.0.1 was taken"):
        runner.start_lab(busy_port, TOKEN, log=None, timeout=60)
    out, err = capfd.readouterr()
    assert "token=" not in out + err


@NEEDS_LAB
def test_real_start_prints_the_bound_port_and_keeps_the_token_out_of_argv(tmp_path):
    port = _free_port()
    proc, info, token = runner.start_lab(port, TOKEN, env={**runner.os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)},
                                         log=None, timeout=90)
    try:
        # the runtime info the URL is read from is the server's own file, and its port is the one asked for
        written = json.loads((tmp_path / f"jpserver-{proc.pid}.json").read_text())
        url = runner.lab_url(info, token)
        assert int(written["port"]) == port == int(url.split(":")[2].split("/")[0])
        assert url == f"http://127.0.0.1:{port}/lab?token={TOKEN}"
        argv = (runner.Path("/proc") / str(proc.pid) / "cmdline").read_bytes().decode()
        assert TOKEN not in argv and "jupyterlab" in argv  # what `ps` shows every local user
        environ = (runner.Path("/proc") / str(proc.pid) / "environ").read_bytes().decode()
        assert f"JUPYTER_TOKEN={TOKEN}" in environ.split("\0")  # readable by this user only
        # the server takes the token from the environment
        ok = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={TOKEN}", timeout=10)
        assert ok.status == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=wrong", timeout=10)
        assert e.value.code == 403
    finally:
        proc.terminate()
        proc.wait(30)



@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_stops_jupyterlab_too(sig, monkeypatch, capsys):
    # the launcher with a stand-in server (a sleeping child), signalled while it waits on the server: both end,
    # never the launcher alone (which would leave the server serving with the token it printed)
    import os
    import signal
    import subprocess
    import threading

    signum = getattr(signal, sig)
    child = subprocess.Popen(["sleep", "60"])
    monkeypatch.setattr(runner, "start_lab", lambda port, token=None: (child, {"port": port}, "t"))
    monkeypatch.setattr(runner, "lab_url", lambda info, token: "http://127.0.0.1/")

    class NotHandled(Exception):
        pass

    def fallback(*_):  # reached only if the launcher installed no handler of its own
        raise NotHandled(sig)

    old = signal.signal(signum, fallback)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signum))
    try:
        timer.start()
        try:
            runner.lab(8888)
            code = None
        except SystemExit as e:  # the launcher's own exit: the signal's status
            code = e.code
    finally:
        timer.cancel()
        signal.signal(signum, old)
        if child.poll() is None:
            child.kill()
            child.wait()
            pytest.fail(f"{sig}: the launcher stopped but its server (pid {child.pid}) kept running")
    assert code == 128 + signum
    assert signal.getsignal(signum) is old or signal.getsignal(signum) == old  # the launcher's handler removed

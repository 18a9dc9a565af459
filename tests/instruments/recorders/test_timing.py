"""The device timer: call counts, quantiles, bad counts, the CPU-only message of graph timing."""
import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders.timing import _quantile, time_device, time_graph


def test_time_device_counts_calls_and_orders_quantiles():
    calls = []
    t = time_device(lambda: calls.append(1), warmup=2, reps=7, cuda=False)
    assert len(calls) == 9 and t.reps == 7 and len(t.samples_us) == 7 and t.timer == "wall"
    assert 0 <= t.p10_us <= t.median_us <= t.p90_us
    assert t.median_us == sorted(t.samples_us)[3]


@pytest.mark.parametrize("warmup,reps", [(-1, 3), (0, 0), (1, 2.5)])
def test_time_device_rejects_bad_counts(warmup, reps):
    with pytest.raises(ValueError):
        time_device(lambda: None, warmup=warmup, reps=reps)


def test_quantile_matches_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert _quantile(xs, 0.1) == pytest.approx(1.4)
    assert _quantile(xs, 0.9) == pytest.approx(4.6)
    assert _quantile([7.0], 0.9) == 7.0


@pytest.mark.skipif(runtime.has_cuda(), reason="checks the CPU-only message")
def test_graph_timing_needs_a_gpu():
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        time_graph(lambda: None)



def test_time_device_cuda_path_with_fake_events(monkeypatch):
    """The event-timing branch without a GPU: per-rep events, elapsed ms -> us, sync per rep."""
    clock = {"t": 0.0, "syncs": 0}

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            self.t = clock["t"]

        def synchronize(self):
            clock["syncs"] += 1

        def elapsed_time(self, end):
            return end.t - self.t  # ms

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    durations = iter([9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # two warm-up calls, then five timed

    def fn():
        clock["t"] += next(durations)

    t = time_device(fn, warmup=2, reps=5, cuda=True)
    assert t.timer == "cuda_events" and t.samples_us == [1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
    assert (t.median_us, t.p10_us, t.p90_us) == (3000.0, 1400.0, 4600.0)
    assert clock["syncs"] == 5  # the host waits for every rep's end event

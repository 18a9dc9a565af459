"""harness.counted_launches (every ncu pass of the kernel recordings): each launch compiled and warmed once
outside the profiled range, then launched once inside it, in the order given, so a parser can pair the
counted kernels with their targets by position."""
import types

from lora_moe_lab.instruments.recorders import harness


def test_counted_launches_warm_then_count_in_order(monkeypatch):
    events = []
    cudart = types.SimpleNamespace(cudaProfilerStart=lambda: events.append("start"),
                                   cudaProfilerStop=lambda: events.append("stop"))
    monkeypatch.setattr(harness.torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(harness.torch.cuda, "cudart", lambda: cudart)
    harness.counted_launches([lambda: events.append("a"), lambda: events.append("b")])
    assert events == ["a", "b", "sync", "start", "a", "b", "sync", "stop"]

"""The graph-strategies loader: the folder it is handed, else the catalog's; a missing recording is named.
(The recorded comparison's findings: studies/graphs/test_findings.py.)"""
import pytest

from lora_moe_lab.instruments.analysers.recordings import load_graph_strategies
from lora_moe_lab.provenance import catalog


def test_default_is_the_catalogued_folder():
    a, b = load_graph_strategies(), load_graph_strategies(catalog("graphs.strategies"))
    assert a.samples.equals(b.samples) and a.meta == b.meta


def test_missing_recording_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="studies/graphs/record.py"):
        load_graph_strategies(tmp_path)

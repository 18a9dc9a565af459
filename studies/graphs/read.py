"""The graph-strategies study's recording, read: the folder is the catalog's (data/catalog.json), the loader
the library's (`lora_moe_lab.instruments.analysers.recordings.load_graph_strategies`).

    strategies()   # capture, replay and switches of every strategy (catalog "graphs.strategies")
"""
from __future__ import annotations

from lora_moe_lab.instruments.analysers.recordings import GraphStrategiesRecording, load_graph_strategies
from lora_moe_lab.provenance import catalog


def strategies() -> GraphStrategiesRecording:
    return load_graph_strategies(catalog("graphs.strategies"))

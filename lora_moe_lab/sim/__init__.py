"""The simulator: a host/device queue model of a forward (engine), its costs from the model's own
step list (cost), fitted to recorded GPU data (fit), pushed to the production setting (production),
calibrated on the archived guards recording and kept where the catalog's "simulator" says (calibration).

    from lora_moe_lab import sim
    sim.simulate_forward("qwen3-30b-a3b", 128, "sync", layers=48, timeline=True)
"""
from .cost import (DEFAULT_LAUNCHES, TRITON_OPS, CostModel, forward_ops, forward_us, layer_ops,  # noqa: F401
                   layer_spec, simulate_forward)
from .engine import TIMELINE_COLUMNS, Op, SimResult, simulate, to_trace_tables  # noqa: F401
from .fit import (FIT_BOUNDS, FIT_PARAMS, FIT_PARAMS_RECORDED, FitResult, Validation, diagnose, fit, holdout, judge,  # noqa: F401,E501
                  predict, summarize, trace_rows, validate)
from .production import (PRODUCTION, PRODUCTION_SIGNATURE, compare_production, extrapolate, production_forward_ms,  # noqa: F401
                         scale_model_report, sync_us_to_match, what_if)
from .calibration import (HEADLINE_CHUNK, PRODUCTION_SETTINGS, Calibration, calibrate,  # noqa: F401
                          load_calibration, production_figures, readme_block)
from . import replay_transforms  # noqa: F401  (what-if transformations of a replay Graph)
from .replay import Graph, ReplayError, ReplayResult, build_graph, replay as replay_graph  # noqa: F401  (sim.replay: the module)

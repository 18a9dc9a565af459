"""Figures (pure functions returning plotly Figures: plots, kernel_plots, graph_plots, idle_plots, ...) and the
ipywidgets panels over them (widgets)."""

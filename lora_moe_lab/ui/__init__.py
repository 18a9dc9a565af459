"""Figures (pure functions returning plotly Figures: plots, sim_plots, kernel_plots) and the
ipywidgets panels over them (widgets)."""

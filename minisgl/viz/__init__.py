"""Views of real engine state for the notebooks: each one is a live ipywidgets view in JupyterLab
and a static SVG beside it (what a saved notebook and the site show).

Nothing here is imported by the engine, and ipywidgets / IPython are imported only inside the
functions that display something, so `import minisgl` never needs them.

    timeline      the order of launch / handle / engine work in the normal and overlap loops
    overlap_problems   the four upstream overlap problems, run for real, ours beside upstream's
    stepper       a step-by-step view of those runs
    tryout        `attempt(...)`: run an exercise's try-out lines even while it is still a stub
"""

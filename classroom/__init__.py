"""The classroom beside the engine: views of real engine state for the notebooks, figures, and the
try-out checks under the exercises. Each view is a live ipywidgets view in JupyterLab and a static
SVG beside it (what a saved notebook and the site show).

This package imports `minisgl`, never the other way round: the engine a learner builds holds no
IPython, ipywidgets or matplotlib (tests/test_imports.py keeps it so). Those are imported only
inside the functions that display something, so importing a view needs only the engine.

    kvpool        the page table, token pool and KV pool of a running engine, per step (chapter 4)
    attention_map which KV locations each query of a batch attends to (chapter 5)
    figure        a matplotlib figure as a reproducible SVG (notebooks run with a non-GUI backend)
    svg, display  the small SVG toolkit and the "widget plus static fallback" output the views share
    timeline      the order of launch / handle / engine work in the normal and overlap loops
    overlap_problems   the four upstream overlap problems, run for real, ours beside upstream's
    stepper       a step-by-step view of those runs
    tryout        `attempt(...)`: run an exercise's try-out lines even while it is still a stub
    sampling      temperature, top-k and top-p on a real next-token distribution (chapter 6)
    batches       which requests ran in which step, from the event log (chapter 7)
    pages         who holds the KV pages after each step: free, cached, held (chapter 8)
    radix_tree    the radix prefix cache, frame by frame: insert / match / lock / evict (chapter 9)
    chunks        the prefill token budget and the chunks that fill it, step by step (chapter 10)
"""

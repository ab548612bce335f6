"""The workbook in a real browser: JupyterLab and the built site in headless Chromium (Playwright,
driving the system's Chromium; no browser is downloaded). `python -m tools.browser --help`."""

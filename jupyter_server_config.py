# JupyterLab for this repository: `jupyter lab --config=jupyter_server_config.py` (the README's
# command). The solution notebooks open read-only, so running one leaves git clean
# (tools/workbook/lab_contents.py).
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
c.ServerApp.contents_manager_class = "tools.workbook.lab_contents.SolutionsReadOnly"  # noqa: F821

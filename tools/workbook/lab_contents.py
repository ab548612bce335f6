"""JupyterLab's file access for this repository: the solution notebooks open read-only.

Running a solution notebook in JupyterLab changes its outputs (timings, execution counts), and
JupyterLab saves them every two minutes: the committed, generated notebook would show as
modified in git. Reported as not writable (the contents API's `writable`), a solution opens with
JupyterLab's read-only mark: every cell runs as usual, nothing is saved over it, and "Save As"
keeps a copy of one's own. Used by `jupyter_server_config.py` at the repository's root:

    jupyter lab --config=jupyter_server_config.py
"""

from __future__ import annotations

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

READ_ONLY = ("solutions/",)  # relative to the server's root folder, which is the repository's


def read_only(path: str) -> bool:
    path = path.lstrip("/")
    return path.endswith(".ipynb") and path.startswith(READ_ONLY)


class SolutionsReadOnly(AsyncLargeFileManager):
    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if read_only(path):
            model["writable"] = False
        return model

    async def save(self, model, path=""):
        if read_only(path) and model.get("type") == "notebook":
            from tornado.web import HTTPError

            raise HTTPError(
                403, f"{path} is generated and read-only here: use File > Save Notebook As"
            )
        return await super().save(model, path)

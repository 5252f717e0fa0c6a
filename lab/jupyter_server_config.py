"""The learner's Jupyter server (`make lab`; lab/README.md): notebooks open unmodified.

JupyterLab writes the kernel's ``language_info`` into a notebook's metadata when the
kernel starts (NotebookPanel's _updateLanguage), and the notebook is modified unless the
value it holds is deep-equal to the kernel's. The kernel's holds the Python's full version
("3.11.7", "3.12.1"), which no committed notebook can match on every learner's machine, so
the released notebooks keep the short form ({"name": "python", "version": "3.11"}) and this
server hands each Python notebook to JupyterLab with the language_info of this server's own
python3 kernel (ipykernel in this environment, the kernel `make lab` starts): opening a
notebook leaves it unmodified, and closing it asks nothing. The file on disk changes only
when the learner saves. The JSON beside this file turns nbgrader's instructor screens off.
"""
import copy

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


class LearnerContentsManager(AsyncLargeFileManager):
    """The default contents manager, with a Python notebook's ``language_info`` as this
    environment's ipykernel reports it (see the module's docs)."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "notebook" and content and isinstance(model.get("content"), dict):
            metadata = model["content"].setdefault("metadata", {})
            kernel = metadata.get("kernelspec") or {}
            info = metadata.get("language_info") or {}
            if kernel.get("name") == "python3" and info.get("name") == "python":
                from ipykernel.ipkernel import IPythonKernel

                metadata["language_info"] = copy.deepcopy(IPythonKernel.language_info)
        return model


c = get_config()  # noqa: F821 (traitlets gives config files get_config)
c.ServerApp.contents_manager_class = LearnerContentsManager
# the README's pip line run as root (a container, a hosted notebook's terminal) starts as
# `make lab` does there; as any other user this changes nothing
c.ServerApp.allow_root = True

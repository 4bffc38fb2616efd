"""Figures of docs/why_three_dense.md, drawn with matplotlib's object API
(no pyplot state), each returned as a Figure to save or show."""

from matplotlib import figure


def attention_grid(panels, title=None):
  """One row per model, one column per head: `panels` maps a row label to
  (heads, L, L) attention weights (rows: queries, columns: keys). A
  model with fewer heads leaves its other cells empty."""
  columns = max(len(heads) for heads in panels.values())
  fig = figure.Figure(figsize=(2.4 * columns + 1, 2.4 * len(panels)))
  axes = fig.subplots(len(panels), columns, squeeze=False)
  for row, (label, heads) in enumerate(panels.items()):
    for column in range(columns):
      ax = axes[row][column]
      ax.set_xticks([])
      ax.set_yticks([])
      if column >= len(heads):
        ax.axis('off')
        continue
      ax.imshow(heads[column], cmap='viridis', vmin=0, vmax=1)
      ax.set_title(f'head {column}', fontsize=9)
      if column == 0:
        ax.set_ylabel(label, fontsize=9)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return fig

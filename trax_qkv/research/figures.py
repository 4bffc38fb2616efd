"""Figures of docs/why_three_dense.md, drawn with matplotlib's object API
(no pyplot state), each returned as a Figure to save or show."""

from matplotlib import figure


def attention_grid(panels, title=None, tokens=None):
  """One row per model, one column per head: `panels` maps a row label to
  (heads, L, L) attention weights (rows: queries, columns: keys). A
  model with fewer heads leaves its other cells empty. `tokens`, where
  given, label the positions of the first column and the last row."""
  columns = max(len(heads) for heads in panels.values())
  size = 2.4 if tokens is None else 3.2
  fig = figure.Figure(figsize=(size * columns + 1, size * len(panels)))
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
      if tokens is not None and column == 0:
        ax.set_yticks(range(len(tokens)), tokens, fontsize=5)
      if tokens is not None and row == len(panels) - 1:
        ax.set_xticks(range(len(tokens)), tokens, fontsize=5, rotation=90)
      ax.set_title(f'head {column}', fontsize=9)
      if column == 0:
        ax.set_ylabel(label, fontsize=9)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return fig


def forest(rows, margin=None, title=None, xlabel='difference from reference'):
  """A forest plot: per row, a paired difference and its interval.

  Args:
    rows: [(label, mean, low, high)], drawn top to bottom.
    margin: where given, the equivalence band (-margin, +margin) shaded.
    title, xlabel: the figure's.
  """
  fig = figure.Figure(figsize=(6.4, 0.35 * len(rows) + 1.4))
  ax = fig.subplots()
  ys = list(range(len(rows)))[::-1]
  if margin:
    ax.axvspan(-margin, margin, color='0.88', label=f'±{margin} margin')
  ax.axvline(0, color='0.4', linewidth=0.8)
  for y, (_, mean, low, high) in zip(ys, rows):
    ax.plot([low, high], [y, y], color='C0', linewidth=1.5)
    ax.plot([mean], [y], 'o', color='C0', markersize=4)
  ax.set_yticks(ys)
  ax.set_yticklabels([label for label, *_ in rows], fontsize=8)
  ax.set_xlabel(xlabel)
  if margin:
    ax.legend(
      loc='lower left', bbox_to_anchor=(0, 1), fontsize=8, frameon=False
    )
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return fig


def learning_curves(panels, title=None, ylabel='accuracy', sharey=True):
  """One panel per entry of `panels` ({panel title: curves}); in each,
  one line per model, its mean over seeds, the band their range. Curves
  map a label to per-seed lists of (step, value), the same steps in
  every seed; a label keeps its colour across panels. With `sharey`
  False each panel has its own scale (`ylabel` is the first's)."""
  fig = figure.Figure(figsize=(4.2 * len(panels), 3.4))
  axes = fig.subplots(1, len(panels), squeeze=False, sharey=sharey)[0]
  colours = {}
  for curves in panels.values():
    for label in curves:
      colours.setdefault(label, len(colours))
  for ax, (panel, curves) in zip(axes, panels.items()):
    for label, seeds in curves.items():
      i = colours[label]
      steps = [s for s, _ in seeds[0]]
      values = [[v for _, v in seed] for seed in seeds]
      low = [min(v) for v in zip(*values)]
      high = [max(v) for v in zip(*values)]
      mean = [sum(v) / len(v) for v in zip(*values)]
      ax.fill_between(steps, low, high, color=f'C{i}', alpha=0.2, linewidth=0)
      ax.plot(steps, mean, color=f'C{i}', label=label, linewidth=1.2)
    ax.set_title(panel, fontsize=9)
    ax.set_xlabel('step')
  axes[0].set_ylabel(ylabel)
  fullest = max(reversed(axes), key=lambda ax: len(ax.get_lines()))
  fullest.legend(fontsize=7, frameon=False, loc='center right')
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return fig

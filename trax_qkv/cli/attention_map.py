"""trax-qkv-attention-map: what each cross-attention head of a trained model
looks at, for a sentence of your own.

  trax-qkv-attention-map --model_dir runs/validate/reference \\
      --source "twenty-one" --output map.png
  trax-qkv-attention-map --model_dir runs/m30k/reference --source "Ein Hund \\
      rennt." --target "A dog runs." --format json --output map.json

One PNG with a panel per cross-attention layer and head: source subwords on one
axis, target subwords on the other, drawn in an installed font that has
their glyphs, and per layer how different the heads are and how focused
(`trax_qkv.research.head_measures`). Without --target the model's own
greedy translation is used. --format json writes the raw weights and the
measures instead.
"""

import json
import os
import sys

from trax_qkv import cli


def build_parser():
  parser = cli.new_parser('trax-qkv-attention-map', __doc__)
  cli.add_model_dir_flag(parser)
  parser.add_argument('--source', required=True, help='the source sentence')
  parser.add_argument(
    '--target',
    default=None,
    help='the target sentence to teacher-force (default: '
    "the model's greedy translation)",
  )
  parser.add_argument(
    '--output',
    default=None,
    help='file to write (default: attention_map.png, or '
    '.json with --format json)',
  )
  parser.add_argument(
    '--format',
    choices=('png', 'json'),
    default='png',
    help='png: the map; json: the weights, per layer '
    '[head][target token][source token] (default: png)',
  )
  cli.add_attention_flag(parser)
  return parser


def check_output(path):
  """Raises ValueError unless `path` can be written as a file: not a
  directory, and inside a directory that exists or can be created."""
  from trax_qkv import files

  path = os.path.abspath(path)
  if os.path.isdir(path):
    raise ValueError(
      f'output {path} is a directory; give a file name, e.g. '
      f'{os.path.join(path, "attention_map.png")}.'
    )
  parent = files.nearest_existing(os.path.dirname(path))
  if not os.path.isdir(parent):
    raise ValueError(
      f'output {path} cannot be written: {parent} is a file, not a directory.'
    )


def main(argv=None):
  args = build_parser().parse_args(argv)
  output = args.output or f'attention_map.{args.format}'
  from trax_qkv import files
  from trax_qkv.supervised import attention_maps

  try:
    check_output(output)
    source_tokens, target_tokens, weights, target = attention_maps.for_sentence(
      args.model_dir, args.source, args.target, cli.attention_from_flags(args)
    )
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  from trax_qkv.research import head_measures

  measures = head_measures.measures(
    [w[None] for w in weights], [len(source_tokens)], [len(target_tokens)]
  )
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  if args.format == 'json':
    files.write_text(
      output,
      json.dumps(
        {
          'source': args.source,
          'target': target,
          'source_tokens': source_tokens,
          'target_tokens': target_tokens,
          'weights': [w.tolist() for w in weights],
          'head_measures': measures,
        },
        ensure_ascii=False,
      ),
    )
  else:
    from trax_qkv.validation import report

    report.plot_heatmaps(
      weights,
      source_tokens,
      target_tokens,
      output,
      f'"{args.source}" -> "{target}"\n' + report.measures_line(measures),
    )
  print(output)
  return 0

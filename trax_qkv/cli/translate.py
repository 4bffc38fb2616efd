"""trax-qkv-translate: translate sentences with a trained model.

  trax-qkv-translate --model_dir runs/validate/reference "twenty-one"
  cat sentences.de | trax-qkv-translate --model_dir runs/m30k/reference --beam 4
  trax-qkv-translate --model_dir runs/m30k/reference \
      --attention cross_attention=auto --attention causal_attention=auto < in.de

--model_dir is a model directory written by trax-qkv-validate (its
checkpoint, model.json and vocabulary). Sentences come from the arguments,
or one per line from standard input, read --chunk_size lines at a time;
one translation per line goes to standard output, in input order, each
chunk as soon as it is done; progress goes to standard error.

On a terminal (or with --interactive, for a program writing to a pipe)
it translates line by line: the model is loaded once, each line's
translation is printed as soon as it is decoded, and Ctrl-D ends.

The same input with the same options gives the same output. Other lines
choose the batches' shape (rows, padding); where two next tokens score
equal to float32 rounding, another shape may choose the other, so adding
a line can change another's translation there. A sentence translated
alone depends on nothing else (docs/serving.md).
"""

import argparse
import sys

from trax_qkv import cli

# translation.CHUNK_SIZE, which --help cannot import without Trax.
CHUNK_SIZE = 2048


def build_parser():
  parser = cli.new_parser('trax-qkv-translate', __doc__)
  parser.add_argument(
    'sentences',
    nargs='*',
    help='sentences to translate (default: standard input, one per line)',
  )
  cli.add_model_dir_flag(parser)
  cli.add_positive_int(parser, '--beam', 1, 'beam size; 1 decodes greedily')
  parser.add_argument(
    '--alpha',
    type=float,
    default=0.6,
    help='GNMT length penalty of beam search (default: 0.6)',
  )
  cli.add_positive_int(parser, '--batch_size', 32, 'sentences decoded at once')
  parser.add_argument(
    '--max_length',
    type=cli.positive_int,
    default=None,
    help='most tokens decoded per sentence (default: twice the longest '
    "source of each chunk + 10, within the model's max_len)",
  )
  cli.add_positive_int(
    parser,
    '--chunk_size',
    CHUNK_SIZE,
    'lines read, sorted into batches by length and written at a time',
  )
  cli.add_attention_flag(parser)
  parser.add_argument(
    '--interactive',
    action='store_true',
    help='translate standard input line by line, each as soon as it is '
    'read (the default on a terminal)',
  )
  parser.add_argument(  # 0.2.0's flag; cli.attention_from_flags reads it
    '--implementation', default=None, help=argparse.SUPPRESS
  )
  return parser


def read_lines(file, name):
  """The lines of a binary file as text, one at a time; ValueError names
  the first line that is not UTF-8."""
  for number, line in enumerate(file, 1):
    try:
      yield line.rstrip(b'\r\n').decode('utf-8')
    except UnicodeDecodeError as e:
      raise ValueError(
        f'{name} line {number} is not UTF-8 text ({e.reason} '
        f'at byte {e.start}); give one sentence per line in '
        'UTF-8.'
      ) from None


def main(argv=None):
  args = build_parser().parse_args(argv)
  from trax_qkv.supervised import translation

  sentences = args.sentences
  try:
    attention = cli.attention_from_flags(args)
    if args.interactive or (not sentences and sys.stdin.isatty()):
      return _interactive(args, attention, translation)
    if not sentences:
      sentences = read_lines(sys.stdin.buffer, 'standard input')
    for line in translation.translate_lines(
      args.model_dir,
      sentences,
      chunk_size=args.chunk_size,
      n_beams=args.beam,
      alpha=args.alpha,
      attention=attention,
      batch_size=args.batch_size,
      max_length=args.max_length,
      log=lambda line: print(line, file=sys.stderr),
    ):
      _print(line)  # a line as soon as its chunk is done
  except ValueError as e:
    sys.stdout.flush()
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


def _print(line):
  """Prints a translation now; a failed write (a full disk under `>
  file`) raises naming standard output."""
  try:
    print(line, flush=True)
  except OSError as e:
    raise OSError(e.errno, e.strerror, 'standard output') from e


def _interactive(args, attention, translation):
  """One line of standard input in, its translation out, until end of
  input; a line that cannot be translated is one error line, and the
  session goes on."""
  if args.sentences:
    raise ValueError('--interactive reads standard input: drop the sentences.')
  translator = translation.Translator(
    args.model_dir,
    n_beams=args.beam,
    alpha=args.alpha,
    attention=attention,
    batch_size=1,
    max_length=args.max_length,
  )
  translator.warm_up()
  if sys.stdin.isatty():
    print('Type a sentence and press Enter; Ctrl-D ends.', file=sys.stderr)
  try:
    for line in read_lines(sys.stdin.buffer, 'standard input'):
      try:
        (out,) = translator.translate([line])
      except ValueError as e:
        print(f'error: {e}', file=sys.stderr, flush=True)
        continue
      _print(out)
  except KeyboardInterrupt:
    print(file=sys.stderr)
    return 130
  return 0

"""Translation data that runs offline: tensorflow-datasets builders + trax.data.

Three sources, all read through `trax.data.TFDS`:
  * `trax_qkv_numbers` (numbers.py): English -> German number words,
    generated, no download.
  * a directory of parallel text (parallel_text.py), `{split}.{src}` /
    `{split}.{tgt}`, one sentence per line (e.g. ../shared/data/multi30k).
  * any TFDS translation data set the user has prepared, by name.
pipeline.py builds the subword vocabulary offline and the batches.
"""

from trax_qkv.data.numbers import TraxQkvNumbers
from trax_qkv.data.numbers import number_pair
from trax_qkv.data.numbers import number_splits
from trax_qkv.data.parallel_text import SPLIT_FILE_PREFIXES
from trax_qkv.data.parallel_text import ParallelTextError
from trax_qkv.data.parallel_text import parallel_text_dataset
from trax_qkv.data.parallel_text import read_parallel_split
from trax_qkv.data.parallel_text import split_files
from trax_qkv.data.pipeline import DATA_LOCK_FILE
from trax_qkv.data.pipeline import DEFAULT_DATA_DIR
from trax_qkv.data.pipeline import EOS_ID
from trax_qkv.data.pipeline import SeededShuffle
from trax_qkv.data.pipeline import TranslationData
from trax_qkv.data.pipeline import TranslationInputs
from trax_qkv.data.pipeline import build_vocab
from trax_qkv.data.pipeline import check_keys
from trax_qkv.data.pipeline import encode_with_eos
from trax_qkv.data.pipeline import load_split
from trax_qkv.data.pipeline import load_vocab
from trax_qkv.data.pipeline import prepare_translation_data
from trax_qkv.data.pipeline import split_batches
from trax_qkv.data.pipeline import translation_data
from trax_qkv.data.pipeline import translation_vocab_size
from trax_qkv.data.pipeline import vocab_path

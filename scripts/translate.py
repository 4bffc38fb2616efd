#!/usr/bin/env python3
"""`trax-qkv-translate` from a checkout (trax_qkv/cli/translate.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import trax_qkv_cli  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == '__main__':
  sys.exit(trax_qkv_cli.run('translate'))

#!/usr/bin/env python3
"""Train diagnose's word model (``rocmforge/diagnose/words.json``) on the fixture corpus.

The corpus is ``tests/data/diagnose`` without the blind directories (``tests/data/diagnose/BLIND``):
a blind set is never trained on. The output depends only on the corpus, so running this again
on the same corpus writes the same bytes (a test checks that the shipped model is current).

    python scripts/train_diagnose_words.py            # write the model
    python scripts/train_diagnose_words.py --check    # exit 1 if the shipped model is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from diagnose_eval import corpus, train_words  # noqa: E402

from rocmforge.diagnose.words import MODEL_FILE  # noqa: E402
from rocmforge.fsutil import atomic_write  # noqa: E402


def model_text() -> str:
    """The model trained on the whole non-blind corpus, as the bytes shipped."""
    return train_words(corpus()).to_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the shipped model is current")
    args = parser.parse_args()
    try:
        import numpy  # noqa: F401  (training needs it; diagnose itself does not)
    except ModuleNotFoundError:
        print("training the word model needs numpy: pip install -e '.[test]' (or pip install numpy)")
        return 2
    text = model_text()
    if args.check:
        current = MODEL_FILE.read_text() if MODEL_FILE.is_file() else ""
        print(
            f"{MODEL_FILE}: {'current' if current == text else 'stale; run scripts/train_diagnose_words.py'}"
        )
        return 0 if current == text else 1
    atomic_write(MODEL_FILE, text)
    print(f"wrote {MODEL_FILE} ({len(text) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

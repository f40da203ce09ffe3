"""The files of tests/data: their directory, their bytes (read once), and tests/data/weights.py (the
deterministic weights the committed models were generated with)."""

import sys

from .server import REPO_ROOT

DATA_DIR = REPO_ROOT / "tests" / "data"
# weights.py is also imported as a top-level module by the generators in tests/data (gen_onnx.py, gen_tf.py)
if str(DATA_DIR) not in sys.path:
    sys.path.insert(0, str(DATA_DIR))

import weights  # noqa: E402,F401  (tests/data/weights.py)

_BLOBS = {}


def data_blob(filename):
    """The bytes of tests/data/<filename>, read once."""
    if filename not in _BLOBS:
        _BLOBS[filename] = (DATA_DIR / filename).read_bytes()
    return _BLOBS[filename]

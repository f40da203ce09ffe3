"""Deterministic weights shared by the model generator and the tests that check outputs."""
import numpy as np

LINEAR_W = (np.arange(12, dtype=np.float32).reshape(4, 3) / 10).astype(np.float32)
LINEAR_B = np.array([0.5, -1.0, 2.0], dtype=np.float32)

HEAVY_WIDTH = 256
HEAVY_DEPTH = 24
HEAVY_W = (np.random.default_rng(7).standard_normal((HEAVY_WIDTH, HEAVY_WIDTH)) / np.sqrt(HEAVY_WIDTH)).astype(np.float32)


def linear(x):
    return x @ LINEAR_W + LINEAR_B


def heavy(x):
    for _ in range(HEAVY_DEPTH):
        x = np.tanh(x @ HEAVY_W)
    return x

"""Helpers of the flow tests, imported by the test files (``from helpers.checks import check_error``) and by the
scripts of tests/reliability, bench/ and tests/data (which put tests/flow on sys.path themselves; under pytest
the rootdir conftest.py puts it there). conftest.py itself holds only the fixtures and pytest hooks.

  server.py        RedisServer (one redis-server / valkey-server with the module), server_flavor, free_port,
                   the paths and environment: REPO_ROOT, MODULE_PATH, SERVER_BIN, ONNX_LIB, TF_LIB, TFLITE_LIB
  resp.py          RESP on a plain socket: raw_command, RespError, RespReader, RawClient, encode_command
  checks.py        check_error, check_error_raw, wait_for, wait_replicas, module_names, WRONGTYPE, NOT_IN_TXN
  data.py          the files of tests/data: DATA_DIR, data_blob, weights (tests/data/weights.py)
  onnx_models.py   ONNX test models, tensor and INFO helpers, Request, models generated with `onnx`
  torch_models.py  TorchScript test models, script sources and script calls
  tf_graphs.py     hand-encoded TensorFlow GraphDefs (no dependency: tests/data/gen_tf.py imports it)
  recorded.py      the cases recorded from RedisAI (tests/data/redisai-dumps.json)
  aof.py           reading a server's AOF, waiting for rewrites

Keep this file free of imports, so that importing helpers.tf_graphs needs nothing but the standard library.
"""

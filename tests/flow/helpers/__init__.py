"""Helpers of the flow tests, imported by the test files (``from helpers.checks import check_error``) and by the
scripts of tests/reliability, bench/ and tests/data (which put tests/flow on sys.path themselves; under pytest
the rootdir conftest.py puts it there). conftest.py itself holds only the fixtures and pytest hooks.

  server.py        RedisServer (one redis-server / valkey-server with the module), server_flavor, free_port,
                   the paths and environment: REPO_ROOT, MODULE_PATH, SERVER_BIN, ONNX_LIB, TF_LIB, TFLITE_LIB
  resp.py          RESP on a plain socket: raw_command, RespError, RespReader, RawClient, encode_command
  checks.py        check_error, check_error_raw, error_text, wait_for, wait_replicas, module_names, WRONGTYPE,
                   NOT_IN_TXN
  data.py          the files of tests/data: DATA_DIR, data_blob, weights (tests/data/weights.py)
  onnx_models.py   ONNX test models, tensor and INFO helpers, Request, models generated with `onnx`
  torch_models.py  TorchScript test models, script sources and script calls
  tf_models.py     the committed TF graphs and how they are stored, a GraphDef reader and numpy evaluator
  tflite_models.py the committed TFLITE models and how they are stored, a hand-built WHILE model
  tf_graphs.py     hand-encoded TensorFlow GraphDefs (no dependency: tests/data/gen_tf.py imports it)
  dag.py           AI.DAGEXECUTE argv (dag_cmd), tensors set and read as numpy arrays (tset, tget)
  rdb.py           DUMP payloads built byte by byte: RDB encoding, CRC-64, module type ids, AI_TENSOR and
                   AI__MODEL layouts (model_payload)
  recorded.py      the cases recorded from RedisAI (tests/data/redisai-dumps.json), assert_reply
  admission.py     what a refused model kept from RESTORE / RDB / AOF must look like (never run)
  watch.py         inotify on a file the server must not read
  aof.py           reading a server's AOF, waiting for rewrites

No test file imports another test file: what test files share lives here. tests/README.md says which file
tests what.

Keep this file free of imports, so that importing helpers.tf_graphs needs nothing but the standard library.
"""

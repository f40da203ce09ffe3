#!/usr/bin/env python3
"""Generates src/admission/tf_ops.txt, the TensorFlow op allowlist of the TF model admission check
(src/admission/tensorflow.rs), from the op registry of the TensorFlow library the module runs.

    scripts/gen-tf-ops.py [--lib PATH] [--out PATH] [--check]

--lib      libtensorflow_cc.so.2 (default: the build's backend cache, scripts/fetch-backend.sh --dir tensorflow)
--out      the file to write (default: src/admission/tf_ops.txt)
--check    write nothing; exit 1 if the committed file differs from what this library and these rules give

Every op of the registry (TF_GetAllOpList, a serialized OpList read here with a small protobuf reader: no
TensorFlow Python package) is classified by the RULES below, first match wins: an op that matches a rule is
denied with that rule's class, every other op is allowed. Ops that no registry of this version has (a newer
TensorFlow's, a custom op's) are in neither list, and the check refuses them.

So that a new TensorFlow version cannot slip an I/O op into the allowlist unnoticed, an allowed op whose input
or attr names hint at I/O (file, path, url, address, ...) or that TensorFlow marks as distributed communication
must be listed in REVIEWED with why it is harmless; otherwise this script stops and names it.
"""

import argparse
import ctypes
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "src", "admission", "tf_ops.txt")

# class -> the end of the client's error: "TF model refused: node 'n' uses op X, which <reason>".
CLASSES = {
    "files": "reads or writes files",
    "mmap": "memory-maps a file",
    "checkpoint": "saves or restores checkpoints (files)",
    "reader": "reads files (a queue-based reader)",
    "dataset": "is a tf.data dataset or iterator op (they read and write files)",
    "debug": "is a debugger op (it writes tensor dumps to debug URLs such as file://)",
    "print": "prints to the server's log or to a file",
    "summary": "writes TensorBoard summaries to files or a database",
    "python": "calls Python",
    "network": "talks to other processes or machines (RPC, collectives, send/recv, distributed runtime)",
    "abort": "aborts the server process",
    "accelerator": "is a TPU/XLA op (it compiles or launches code for accelerators)",
    "code": "compiles code given as text (an MLIR module) that can hold any op",
    "internal": "is internal to TensorFlow (inserted by its own graph rewrites, never stored in a model)",
    "uninit": "returns uninitialized memory, which can hold other requests' data",
    "batching": "batches requests in process-wide queues with threads of its own",
    "staging": "waits on a staging area that runs share, a wait no timeout can interrupt",
}

# (class, explicit op names, name patterns): first match wins, so the specific rules come first.
RULES = [
    ("files", {
        "ReadFile", "WriteFile", "MatchingFiles", "FileSystemSetConfiguration", "MergeV2Checkpoints",
        "InitializeTableFromTextFile", "InitializeTableFromTextFileV2", "LoadAndRemapMatrix",
        "GenerateVocabRemapping", "Skipgram",
        "FixedUnigramCandidateSampler",  # attr vocab_file: reads the vocabulary from a file
        "RecordInput",  # attr file_pattern: reads record files
        "DecodeProtoV2", "EncodeProto",  # attr descriptor_source may name a descriptor file
        "DumpTensor",  # attrs log_dir_path + file_name (quantization debugging): writes files
        "CalibrationStatisticsSaver",  # attr output_file_path: writes calibration statistics
    }, []),
    ("mmap", {"ImmutableConst"}, []),
    ("checkpoint", {"DTensorRestoreV2"}, [r"^(Save|Restore)(V2|Slice|Slices)?$"]),
    ("reader", set(), [r"Reader(V2)?$", r"^Reader"]),
    ("dataset", {
        "AnonymousMemoryCache", "DeleteMemoryCache", "DummyMemoryCache",
        "AnonymousSeedGenerator", "AnonymousRandomSeedGenerator", "DeleteSeedGenerator",
        "DeleteRandomSeedGenerator", "DummySeedGenerator", "DummyIterationCounter",
        "CompressElement", "UncompressElement", "DistributedSave", "GetElementAtIndex", "GetOptions",
        "ThreadPoolHandle", "ExperimentalThreadPoolHandle", "MapDefun", "WindowOp", "ComputeBatchSize",
        "OptionalFromValue", "OptionalGetValue", "OptionalHasValue", "OptionalNone",
    }, [r"Dataset", r"Iterator", r"^(Experimental)?StatsAggregator"]),
    ("debug", {"Copy", "CopyHost"}, [r"^Debug"]),
    ("print", {"Print", "PrintV2"}, []),
    ("summary", {
        "CreateSummaryFileWriter", "CreateSummaryDbWriter", "SummaryWriter", "FlushSummaryWriter",
        "CloseSummaryWriter", "ImportEvent",
    }, [r"^Write\w*Summary$"]),
    ("python", {"PyFunc", "PyFuncStateless", "EagerPyFunc"}, []),
    ("network", {
        "DeleteRpcFutureResource", "RemoteCall", "AllToAll", "CrossReplicaSum", "Send", "Recv", "_Send", "_Recv",
        "_HostSend", "_HostRecv", "WorkerHeartbeat", "CopyToMesh", "CopyToMeshGrad", "Relayout", "RelayoutLike",
    }, [r"^Rpc", r"^TryRpc", r"^Collective", r"^_?Nccl", r"^DTensor"]),
    ("abort", {"Abort"}, []),
    ("accelerator", {
        # TPU embedding / SparseCore helpers (tpu_embedding_ops.cc, sparse_core_*.cc)
        "ComputeDedupDataSize", "ComputeDedupDataSizeV2", "ComputeDedupDataTupleMask",
        "ComputeDedupDataTupleMaskV2", "MergeDedupData", "SplitDedupData", "ConvertToCooTensor",
        "ConvertToListOfSparseCoreCooTensors", "ConvertToSparseCoreCsrWrappedCooTensor",
        "GetMinibatchSplitsWithPhysicalReplica", "GetMinibatchesInCsrWithPhysicalReplica",
        "GetStatsFromListOfSparseCoreCooTensors", "SortListOfSparseCoreCooTensors",
        "StoreMinibatchStatisticsInFdo", "UpdateTaskIdAndGlobalCoreArray", "GlobalIterId",
    }, [r"TPU", r"Tpu", r"Xla", r"^Infeed", r"^Outfeed", r"^Prelinearize"]),
    ("code", {"MlirPassthroughOp"}, []),
    ("uninit", {
        "Empty",  # init=false returns the allocator's bytes as they are
        "TemporaryVariable", "DestroyTemporaryVariable",  # readable before any assignment
        "FakeParam",  # a placeholder allocated and never written
        "ParallelConcat",  # its shape attr may have more rows than it is given values: the rest is never written
    }, []),
    ("batching", {"Batch", "BatchFunction", "Unbatch", "UnbatchGrad"}, []),
    # An unstage or peek of an empty area (a full one for a stage) blocks its thread on a condition variable
    # that no cancellation reaches: the run never ends, and its worker (and queue) with it. Queues, barriers
    # and accumulators wait through the cancellation manager instead (MODEL_EXECUTION_TIMEOUT stops them).
    ("staging", {"Stage", "Unstage", "StagePeek", "StageSize", "StageClear"},
     [r"^(Ordered)?Map(Stage|Unstage|UnstageNoKey|Peek|Size|IncompleteSize|Clear)$"]),
    ("internal", set(), [r"^_"]),
]

# Allowed ops whose arg or attr names look like I/O (or that TensorFlow marks as distributed communication),
# each reviewed: why it stays allowed.
REVIEWED = {
    "ApproxTopK": "recall_target is a float",
    "InTopK": "targets are class ids",
    "InTopKV2": "targets are class ids",
    "RegexFullMatch": "pattern is an RE2 regular expression (linear time)",
    "RegexReplace": "pattern is an RE2 regular expression (linear time)",
    "StaticRegexFullMatch": "pattern is an RE2 regular expression (linear time)",
    "StaticRegexReplace": "pattern is an RE2 regular expression (linear time)",
    "PartitionedCall": "config_proto only tunes graph optimization; f is checked like every func attr",
    "StatefulPartitionedCall": "config_proto only tunes graph optimization; f is checked like every func attr; "
                               "marked distributed because f may span devices (all local here)",
    **{op: "the quantile stream is an in-memory resource of the session" for op in (
        "BoostedTreesCreateQuantileStreamResource", "BoostedTreesFlushQuantileSummaries",
        "BoostedTreesQuantileStreamResourceAddSummaries", "BoostedTreesQuantileStreamResourceDeserialize",
        "BoostedTreesQuantileStreamResourceFlush", "BoostedTreesQuantileStreamResourceGetBucketBoundaries",
        "IsBoostedTreesQuantileStreamResourceInitialized")},
    "ShardedFilename": "only formats a file name string (no file access)",
    "ShardedFilespec": "only formats a file name string (no file access)",
    "CTCBeamSearchDecoder": "top_paths is a count",
    "NegTrain": "vocab_count is a list of ints (word2vec training on tensors)",
}

IO_WORDS = {
    "file", "filename", "filenames", "files", "path", "paths", "dir", "directory", "logdir", "url", "urls", "uri",
    "pattern", "address", "port", "target", "targets", "prefix", "prefixes", "stream", "socket", "server", "dump",
    "descriptor", "mlir", "module", "writer", "proto", "vocab", "ckpt", "checkpoint",
}


# --------------------------------------------------------------------------------------------------
# the registry


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """(field number, value) of one message: an int for varints, bytes for length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unexpected wire type {wire} in OpList")
        yield number, value


def parse_oplist(data):
    """[{name, args: [input/output arg names], attrs: [(name, type)], distributed}] from an OpList."""
    ops = []
    for number, op in fields(data):
        if number != 1:  # OpList.op
            continue
        entry = {"name": "", "args": [], "attrs": [], "distributed": False}
        for n, v in fields(op):
            if n == 1:  # OpDef.name
                entry["name"] = v.decode()
            elif n in (2, 3):  # input_arg, output_arg: ArgDef.name = 1
                entry["args"] += [a.decode() for k, a in fields(v) if k == 1]
            elif n == 4:  # attr: AttrDef.name = 1, type = 2
                d = {k: a for k, a in fields(v) if k in (1, 2)}
                entry["attrs"].append((d.get(1, b"").decode(), d.get(2, b"").decode()))
            elif n == 21:  # is_distributed_communication
                entry["distributed"] = bool(v)
        ops.append(entry)
    return ops


def default_lib():
    out = subprocess.run([os.path.join(REPO, "scripts", "fetch-backend.sh"), "--dir", "tensorflow"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return os.path.join(out, "lib", "libtensorflow_cc.so.2")


def registry(lib_path):
    """(TensorFlow version, serialized OpList) of the library."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no oneDNN banner
    lib = ctypes.CDLL(lib_path)

    class Buffer(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t), ("dealloc", ctypes.c_void_p)]

    lib.TF_Version.restype = ctypes.c_char_p
    lib.TF_GetAllOpList.restype = ctypes.POINTER(Buffer)
    lib.TF_DeleteBuffer.argtypes = [ctypes.POINTER(Buffer)]
    buf = lib.TF_GetAllOpList()
    data = ctypes.string_at(buf.contents.data, buf.contents.length)
    lib.TF_DeleteBuffer(buf)
    return lib.TF_Version().decode(), data


# --------------------------------------------------------------------------------------------------
# classification


def classify(name):
    """The denied class of an op, or None when it is allowed."""
    for cls, names, patterns in RULES:
        if name in names or any(re.search(p, name) for p in patterns):
            return cls
    return None


def looks_like_io(op):
    names = op["args"] + [a for a, _ in op["attrs"]]
    words = {w for n in names for w in n.lower().split("_")}
    return bool(words & IO_WORDS) or any("file" in n.lower() or "path" in n.lower() for n in names)


def render(version, ops):
    by_name = {op["name"]: op for op in ops}
    denied = {}
    for name in sorted(by_name):
        cls = classify(name)
        if cls:
            denied.setdefault(cls, []).append(name)
    allowed = sorted(n for n in by_name if not classify(n))

    unreviewed = [n for n in allowed if (looks_like_io(by_name[n]) or by_name[n]["distributed"]) and n not in REVIEWED]
    if unreviewed:
        sys.exit("gen-tf-ops: allowed ops that look like I/O; deny them in RULES or explain them in REVIEWED:\n  "
                 + "\n  ".join(f"{n}: args {by_name[n]['args']} attrs {by_name[n]['attrs']}" for n in unreviewed))
    unused = [c for c in CLASSES if c not in denied]
    explicit = {n for _, names, _ in RULES for n in names}
    missing = sorted(explicit - set(by_name))
    lines = [
        f"# TensorFlow op admission list: generated by scripts/gen-tf-ops.py from the op registry of TensorFlow",
        f"# {version} (TF_GetAllOpList: {len(by_name)} ops). Do not edit: change the rules in the script and run it.",
        "#",
        "# `allow <op>`: the op may appear in a stored TF graph (and be named by a func attr).",
        "# `deny <op> <class>`: refused; `class <class> <reason>` gives the end of the client's error",
        "# (\"TF model refused: node 'n' uses op <op>, which <reason>\").",
        "# An op in neither list (not in this TensorFlow's registry) is refused too. `version` names the registry.",
    ]
    if missing:
        lines.append("# Named by the rules but not in this registry: " + " ".join(missing))
    if unused:
        lines.append("# Classes without ops in this registry: " + " ".join(unused))
    lines += ["", f"version {version}", ""]
    for cls, reason in CLASSES.items():
        lines.append(f"class {cls} {reason}")
    lines.append("")
    for cls in CLASSES:
        for name in denied.get(cls, []):
            lines.append(f"deny {name} {cls}")
    lines.append("")
    lines += [f"allow {name}" for name in allowed]
    return "\n".join(lines) + "\n", allowed, denied


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    version, data = registry(args.lib or default_lib())
    text, allowed, denied = render(version, parse_oplist(data))
    if args.check:
        with open(args.out) as f:
            if f.read() != text:
                sys.exit(f"gen-tf-ops: {args.out} is not what the rules give for TensorFlow {version}; run the script")
        return
    with open(args.out, "w") as f:
        f.write(text)
    n_denied = sum(len(v) for v in denied.values())
    print(f"{args.out}: TensorFlow {version}: {len(allowed)} allowed, {n_denied} denied "
          + ", ".join(f"{c} {len(v)}" for c, v in denied.items()), file=sys.stderr)


if __name__ == "__main__":
    main()

"""The commands of the redisai-rs wheel: ``redisai-rs`` (= ``python -m redisai_rs``) and ``redisai-rs-server``."""

import os
import sys

from . import (RedisAIError, __version__, backends, describe_command, loadmodule_line, module_args, module_path,
               server_command)

MAIN_USAGE = """\
usage: redisai-rs --version | --loadmodule-line [--gpu] [RedisAI args...] | --module-path | --module-args [--gpu]
                  | --check

  --version          the module's version and each backend's (installed version, or how to install it)
  --loadmodule-line  the `loadmodule ...` line for a redis.conf: the module and every installed backend,
                     then the RedisAI load-time arguments given after it (e.g. THREADS_PER_QUEUE 4)
  --module-path      the path of libredisai.so
  --module-args      the backend arguments alone (ONNX <lib> TF <lib> TFLITE <lib> TORCH <lib>)
  --check            exit 1 (saying what to do) if a backend's installed version is not the pinned one
  --gpu              TORCH through libtorch's CUDA libraries (the torch wheel's CUDA build, `redisai-rs[gpu]`);
                     ONNX on GPU needs onnxruntime-gpu in place of onnxruntime (docs/commands.md, Deployment)

Start a server with `redisai-rs-server [redis-server args...] [-- RedisAI args...]`."""

SERVER_USAGE = """\
usage: redisai-rs-server [--redis-server PATH] [--gpu] [--print-command] [redis-server args...] [-- RedisAI args...]

Runs redis-server (PATH, $REDIS_SERVER or --redis-server; valkey-server works too) with the redisai-rs module and
every installed backend: `redis-server [redis-server args...] --loadmodule <libredisai.so> ONNX <lib> ...
[RedisAI args...]`. A config file, if any, comes first among the redis-server args. RedisAI's load-time
arguments (THREADS_PER_QUEUE 4, MODEL_EXECUTION_TIMEOUT 2000, ONNX <path>, ...) go after `--`, unchanged;
a backend path given there replaces the installed wheel's.

  --redis-server PATH  the server binary
  --gpu                TORCH on CUDA (see `redisai-rs --help`)
  --print-command      print the command line instead of running it

e.g.  redisai-rs-server --port 6380 --save '' -- THREADS_PER_QUEUE 2"""


def _fail(prog, err):
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 1


def print_version(out=sys.stdout):
    print(f"redisai-rs {__version__} (RedisAI 1.2.7 compatible module)", file=out)
    try:
        print(f"  module  {module_path()}", file=out)
    except RedisAIError as e:
        print(f"  module  MISSING: {e}", file=out)
    ok = True
    for b in backends():
        pin = f"{b.requirement}=={b.version}"
        if b.installed is None:
            state = f"not installed ({b.install_hint})"
        elif b.problem():
            state = f"{b.distribution} {b.installed}: NOT USABLE, {b.problem()}"
            ok = False
        else:
            state = f"{b.distribution} {b.installed}"
        print(f"  {b.name:<7} {state}   [pin {pin}]", file=out)
    return ok


def main(argv=None):
    prog = "redisai-rs"
    args = list(sys.argv[1:] if argv is None else argv)
    gpu = "--gpu" in args
    args = [a for a in args if a != "--gpu"]
    try:
        if not args or args[0] in ("-h", "--help"):
            print(MAIN_USAGE)
            return 0 if args else 2
        cmd, rest = args[0], args[1:]
        if cmd in ("--version", "-V"):
            return 0 if print_version() else 1
        if cmd == "--loadmodule-line":
            print(loadmodule_line(gpu=gpu, extra_args=rest))
            return 0
        if rest:
            return _fail(prog, f"unexpected arguments after {cmd}: {' '.join(rest)}\n{MAIN_USAGE}")
        if cmd == "--module-path":
            print(module_path())
        elif cmd == "--module-args":
            print(describe_command(module_args(gpu=gpu)))
        elif cmd == "--check":
            module_args(gpu=gpu)
            module_path()
            print_version()
        else:
            return _fail(prog, f"unknown option {cmd}\n{MAIN_USAGE}")
        return 0
    except RedisAIError as e:
        return _fail(prog, e)


def server_main(argv=None):
    prog = "redisai-rs-server"
    args = list(sys.argv[1:] if argv is None else argv)
    redis_server, gpu, dry_run = None, False, False
    # Launcher options come first; everything from the first other argument on belongs to redis-server.
    while args:
        a = args[0]
        if a in ("-h", "--help"):
            print(SERVER_USAGE)
            return 0
        if a == "--redis-server":
            if len(args) < 2:
                return _fail(prog, "--redis-server needs a path")
            redis_server, args = args[1], args[2:]
        elif a.startswith("--redis-server="):
            redis_server, args = a.split("=", 1)[1], args[1:]
        elif a == "--gpu":
            gpu, args = True, args[1:]
        elif a == "--print-command":
            dry_run, args = True, args[1:]
        else:
            break
    if "--" in args:
        i = args.index("--")
        server_args, extra = args[:i], args[i + 1:]
    else:
        server_args, extra = args, []
    try:
        argv, env, notes = server_command(server_args, extra, redis_server=redis_server, gpu=gpu)
    except RedisAIError as e:
        return _fail(prog, e)
    for n in notes:
        print(f"{prog}: {n}", file=sys.stderr)
    if dry_run:
        ld = env.get("LD_LIBRARY_PATH")
        prefix = f"LD_LIBRARY_PATH={ld} " if ld and ld != os.environ.get("LD_LIBRARY_PATH") else ""
        print(prefix + describe_command(argv))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], argv, env)  # the server replaces the launcher: signals and exit status are its own
    except OSError as e:
        return _fail(prog, f"cannot run {argv[0]}: {e}")

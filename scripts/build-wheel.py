#!/usr/bin/env python3
"""Build the `redisai-rs` wheel (`make wheel`): the module, its TORCH backend and a launcher, with the backends as
exact-pinned dependencies from scripts/backends.manifest. Standard library and binutils (strip, readelf) only.

    scripts/build-wheel.py <out dir>     (after `make build`; prints the wheel's path on stdout)

Wheel contents (installed into site-packages):
    redisai_rs/__init__.py, _cli.py, __main__.py   python/redisai_rs/: the launcher (`redisai-rs-server`,
                                                   `redisai-rs`, `python -m redisai_rs`)
    redisai_rs/_build.py                           written here: the module's version, every backend's pin,
                                                   pip extra and library path inside its wheel
    redisai_rs/lib/libredisai.so                   the module (debug information stripped)
    redisai_rs/lib/redisai-worker                  the backend worker (EXECUTION_MODE ISOLATED), beside the module
    redisai_rs/lib/libredisai_torch.so             the TORCH backend, RUNPATH $ORIGIN/../../torch/lib (the torch
                                                   wheel's libraries in the same site-packages)
    redisai_rs/lib/libredisai_torch_cuda.so        TORCH on CUDA (no code: it needs libredisai_torch.so and the
                                                   torch wheel's libtorch_cuda.so + libc10_cuda.so, see
                                                   scripts/gpu-build.sh), `redisai-rs-server --gpu`

Dependencies: onnxruntime by default; extras tf (tensorflow-cpu), tflite (ai-edge-litert), torch, gpu (torch: its
PyPI Linux build is the CUDA 13 one) and all.

Then the check auditwheel would make: every DT_NEEDED of each shipped library must be glibc/libstdc++/libgcc (the
manylinux policy) or be found through its RUNPATH in this wheel or in a declared backend wheel (looked up in that
wheel's file list, in the wheelhouse of scripts/fetch-backend.sh); no RUNPATH may name a path outside the
install; the glibc/libstdc++ symbol versions fix the manylinux tag. The report goes to stderr.
"""
import base64
import csv
import hashlib
import io
import os
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEASE = REPO / "target" / "release"
MANIFEST = REPO / "scripts" / "backends.manifest"
PY_SRC = REPO / "python" / "redisai_rs"
FETCH = REPO / "scripts" / "fetch-backend.sh"

# manifest backend -> the module's name, the pip extra (None: default dependency), other distributions that ship
# the same library at the same version (accepted by the launcher; not declared).
BACKENDS = {
    "onnxruntime": ("ONNX", None, ["onnxruntime-gpu"]),
    "tensorflow": ("TF", "tf", ["tensorflow"]),
    "litert": ("TFLITE", "tflite", []),
    "torch": ("TORCH", "torch", []),
}
ORDER = ["onnxruntime", "tensorflow", "litert", "torch"]
# The library of the torch wheel the launcher checks for (the TORCH backend needs it).
TORCH_MEMBER = "torch/lib/libtorch_cpu.so"

# What the manylinux policies let a wheel's libraries need from the system (auditwheel's lib_whitelist) and the
# newest symbol versions each glibc level's policy allows (auditwheel's policy.json, x86_64).
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
               "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2", "libcrypt.so.1", "libnsl.so.1"}
POLICIES = [  # (glibc minor, GLIBCXX, CXXABI, GCC)
    (17, "3.4.19", "1.3.7", "4.8.0"), (24, "3.4.22", "1.3.10", "6.0.0"), (27, "3.4.24", "1.3.11", "7.0.0"),
    (28, "3.4.25", "1.3.11", "7.0.0"), (31, "3.4.28", "1.3.12", "7.0.0"), (34, "3.4.29", "1.3.13", "7.0.0"),
    (35, "3.4.30", "1.3.13", "12.0.0"), (36, "3.4.30", "1.3.13", "12.0.0"), (38, "3.4.32", "1.3.14", "13.0.0"),
    (39, "3.4.33", "1.3.15", "14.0.0"),
]


def die(msg):
    sys.exit(f"build-wheel: error: {msg}")


def log(msg):
    print(f"build-wheel: {msg}", file=sys.stderr)


def cargo_version():
    m = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M)
    return m.group(1)


def manifest_backends():
    """{backend: {version, requirement (name), pin lines [(name, version)], member}} from the manifest."""
    out = {}
    for line in MANIFEST.read_text().splitlines():
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        backend, version, req, _sha, *actions = line
        name, _, pinned = req.partition("==")
        e = out.setdefault(backend, {"version": version, "lines": [], "members": []})
        e["lines"].append((name, pinned))
        e["members"] += [a.split(":")[1] for a in actions if a.startswith("extract:")]
    for b in ORDER:
        if b not in out:
            die(f"backend {b} is not in {MANIFEST}")
        e = out[b]
        e["requirement"], e["pin"] = e["lines"][0]
        # The backend's own library: the first one extracted from its first wheel (torch: libtorch_cpu.so).
        e["member"] = TORCH_MEMBER if b == "torch" else e["members"][0]
    return out


# ------------------------------------------------------------------------------------------------ ELF

def elf_dynamic(path):
    """(NEEDED list, RUNPATH or RPATH string, [(file offset, length) of that string]) of an ELF64 LE file."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        die(f"{path}: not a 64-bit little-endian ELF file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    dyn = [s for s in sections if s[1] == 6]  # SHT_DYNAMIC
    if not dyn:
        return [], None, None
    _, _, _, _, d_off, d_size, d_link, _, _, d_entsize = dyn[0]
    strtab_off = sections[d_link][4]

    def string(off):
        end = data.index(b"\0", strtab_off + off)
        return data[strtab_off + off:end].decode()

    needed, runpath, where = [], None, None
    for i in range(d_size // d_entsize):
        tag, val = struct.unpack_from("<qQ", data, d_off + i * d_entsize)
        if tag == 0:
            break
        if tag == 1:
            needed.append(string(val))
        elif tag in (15, 29):  # DT_RPATH, DT_RUNPATH
            runpath = string(val)
            where = (strtab_off + val, len(runpath.encode()))
    return needed, runpath, where


def set_runpath(path, new):
    """Rewrite RUNPATH in place (as chrpath does): the new string must not be longer than the old one."""
    _, old, where = elf_dynamic(path)
    if old is None:
        die(f"{path} has no RUNPATH to rewrite")
    off, length = where
    enc = new.encode()
    if len(enc) > length:
        die(f"{path}: RUNPATH {new!r} is longer than the one it replaces ({old!r})")
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(enc + b"\0" * (length - len(enc)))
    if elf_dynamic(path)[1] != new:
        die(f"{path}: RUNPATH rewrite failed")


def symbol_versions(path):
    """{'GLIBC': (2, 34), 'GLIBCXX': (3, 4, 29), ...}: the newest version of each needed from the system."""
    out = subprocess.run(["readelf", "-V", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    newest = {}
    for name, ver in re.findall(r"Name: (GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)", out):
        v = tuple(int(x) for x in ver.split("."))
        newest[name] = max(newest.get(name, v), v)
    return newest


def vtuple(s):
    return tuple(int(x) for x in s.split("."))


# ------------------------------------------------------------------------------------------------ build

def build_gpu_wrapper(out, torch_lib, tmp):
    """libredisai_torch_cuda.so: NEEDED libredisai_torch.so, libtorch_cuda.so, libc10_cuda.so, nothing else.
    Linked against stubs with those sonames (the CUDA libraries are not fetched for a CPU build)."""
    stubs = Path(tmp) / "stubs"
    stubs.mkdir()
    cc = os.environ.get("CC", "cc")
    for name in ("libtorch_cuda.so", "libc10_cuda.so"):
        subprocess.run([cc, "-shared", "-o", str(stubs / name), f"-Wl,-soname,{name}", "-x", "c", "/dev/null"],
                       check=True)
    # ld warns that libredisai_torch.so's own libtorch is not found: expected, it is only linked against.
    r = subprocess.run([cc, "-shared", "-o", str(out), "-x", "c", "/dev/null", "-Wl,--no-as-needed",
                        f"-L{torch_lib.parent}", "-lredisai_torch", f"-L{stubs}", "-ltorch_cuda", "-lc10_cuda",
                        "-Wl,--as-needed", "-Wl,-rpath,$ORIGIN:$ORIGIN/../../torch/lib", "-Wl,-z,noexecstack", "-s"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        die(f"linking {out.name} failed:\n{r.stderr}")


def wheel_members(wheel_dirs):
    """{member path: 'requirement==version'} over the backend wheels in the wheelhouse."""
    out = {}
    for d in wheel_dirs:
        for w in sorted(Path(d).glob("*.whl")):
            name, ver = w.name.split("-")[:2]
            label = f"{name.replace('_', '-')}=={ver}"
            with zipfile.ZipFile(w) as z:
                for n in z.namelist():
                    out.setdefault(n, label)
    return out


def check_libraries(lib_dir, wheel_dirs, declared):
    """The auditwheel-like check. Returns the manylinux tag; dies on anything unresolved."""
    members = wheel_members(wheel_dirs)
    shipped = {p.name for p in lib_dir.iterdir()}
    newest = {}
    failures = []
    log("shared libraries and what resolves their DT_NEEDED (site-packages layout):")
    for so in sorted(lib_dir.iterdir()):
        needed, runpath, _ = elf_dynamic(so)
        dirs = [d for d in (runpath or "").split(":") if d]
        for d in dirs:
            if not d.startswith("$ORIGIN"):
                failures.append(f"{so.name}: RUNPATH entry {d!r} points outside the install")
        log(f"  redisai_rs/lib/{so.name}  RUNPATH {runpath or '(none)'}")
        for n in needed:
            if n in SYSTEM_LIBS:
                how = "system (glibc / libstdc++ / libgcc: manylinux policy)"
            elif n in shipped and "$ORIGIN" in dirs:
                how = f"this wheel (redisai_rs/lib/{n})"
            else:
                how = None
                for d in dirs:
                    rel = os.path.normpath(os.path.join("redisai_rs/lib", d.replace("$ORIGIN", ".")))
                    member = f"{rel}/{n}"
                    if member.startswith("..") or member not in members:
                        continue
                    req = members[member]
                    if req.split("==")[0] not in declared:
                        failures.append(f"{so.name}: {n} comes from {req}, which the wheel does not declare")
                    how = f"backend wheel {req} ({member})"
                    break
                if how is None:
                    failures.append(f"{so.name}: {n} is neither a system library nor in a declared backend wheel")
                    how = "UNRESOLVED"
            log(f"      {n:<24} {how}")
        for k, v in symbol_versions(so).items():
            newest[k] = max(newest.get(k, v), v)
    glibc = newest.get("GLIBC", (2, 17))
    policy = next((p for p in POLICIES if p[0] >= glibc[1]), None)
    if policy is None:
        die(f"GLIBC_{'.'.join(map(str, glibc))} is newer than every known manylinux policy")
    for key, idx in (("GLIBCXX", 1), ("CXXABI", 2), ("GCC", 3)):
        if key in newest and newest[key] > vtuple(policy[idx]):
            failures.append(f"{key}_{'.'.join(map(str, newest[key]))} is newer than manylinux_2_{policy[0]} "
                            f"allows ({key}_{policy[idx]})")
    tag = f"manylinux_2_{policy[0]}_x86_64"
    log("  newest symbol versions: " + ", ".join(f"{k}_{'.'.join(map(str, v))}" for k, v in sorted(newest.items()))
        + f" -> {tag}")
    if failures:
        die("the wheel's libraries need more than glibc and the backend wheels:\n  " + "\n  ".join(failures))
    return tag


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(out_dir, files, name, version, tag, metadata, entry_points):
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: redisai-rs scripts/build-wheel.py\nRoot-Is-Purelib: false\n" \
                 f"Tag: py3-none-{tag}\n"
    files = dict(files)
    files[f"{info}/METADATA"] = (metadata.encode(), 0o644)
    files[f"{info}/WHEEL"] = (wheel_meta.encode(), 0o644)
    files[f"{info}/entry_points.txt"] = (entry_points.encode(), 0o644)
    files[f"{info}/top_level.txt"] = (b"redisai_rs\n", 0o644)
    rec = io.StringIO()
    w = csv.writer(rec, lineterminator="\n")
    for path, (data, _) in files.items():
        w.writerow([path, record_hash(data), len(data)])
    w.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = (rec.getvalue().encode(), 0o644)
    out = Path(out_dir) / f"{dist}-py3-none-{tag}.whl"
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for path, (data, mode) in files.items():  # dist-info last, as the spec recommends
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    tmp.replace(out)
    return out


def main():
    if len(sys.argv) != 2:
        die("usage: scripts/build-wheel.py <out dir>")
    out_dir = Path(sys.argv[1]).resolve()
    version = cargo_version()
    mb = manifest_backends()
    for f in ("libredisai.so", "libredisai_torch.so", "redisai-worker"):
        if not (RELEASE / f).is_file():
            die(f"{RELEASE / f} is missing (run make build)")

    # The backend wheels, for the check (kept by fetch-backend.sh; downloaded only if missing).
    wheel_dirs = subprocess.run([str(FETCH), "--wheels", "all"], check=True, capture_output=True,
                                text=True).stdout.split()

    files = {}
    with tempfile.TemporaryDirectory(prefix="redisai-wheel-") as tmp:
        lib = Path(tmp) / "lib"
        lib.mkdir()
        subprocess.run(["strip", "--strip-debug", "-o", str(lib / "libredisai.so"), str(RELEASE / "libredisai.so")],
                       check=True)
        # The backend worker (EXECUTION_MODE ISOLATED), found beside the module.
        subprocess.run(["strip", "--strip-debug", "-o", str(lib / "redisai-worker"), str(RELEASE / "redisai-worker")],
                       check=True)
        torch_so = lib / "libredisai_torch.so"
        subprocess.run(["strip", "--strip-debug", "-o", str(torch_so), str(RELEASE / "libredisai_torch.so")],
                       check=True)
        # The build's RUNPATH ($ORIGIN:<cache>/torch-<v>/lib) becomes the torch wheel's libraries in the same
        # site-packages: redisai_rs/lib/../../torch/lib.
        set_runpath(torch_so, "$ORIGIN/../../torch/lib")
        build_gpu_wrapper(lib / "libredisai_torch_cuda.so", torch_so, tmp)

        declared = {mb[b]["requirement"] for b in ORDER}
        # libtorch_cpu.so's own CUDA runtime libraries come with torch's dependencies (nvidia-*); the torch
        # wheel's libraries are what the TORCH backend needs directly.
        tag = check_libraries(lib, wheel_dirs, declared)

        for so in sorted(lib.iterdir()):
            files[f"redisai_rs/lib/{so.name}"] = (so.read_bytes(), 0o755)

    for src in sorted(PY_SRC.glob("*.py")):
        files[f"redisai_rs/{src.name}"] = (src.read_bytes(), 0o644)
    entries = []
    for b in ORDER:
        name, extra, alternatives = BACKENDS[b]
        e = mb[b]
        entries.append({"name": name, "requirement": e["requirement"], "version": e["pin"], "extra": extra,
                        "alternatives": alternatives, "member": e["member"]})
    build_py = ('"""Written by scripts/build-wheel.py (make wheel) from Cargo.toml and scripts/backends.manifest."""\n'
                f"VERSION = {version!r}\n"
                "BACKENDS = [\n" + "".join(f"    {e!r},\n" for e in entries) + "]\n")
    files["redisai_rs/_build.py"] = (build_py.encode(), 0o644)

    pins = {b: f"{mb[b]['requirement']}=={mb[b]['pin']}" for b in ORDER}
    requires = [pins["onnxruntime"]]
    extras = {"tf": [pins["tensorflow"]], "tflite": [pins["litert"]], "torch": [pins["torch"]],
              "gpu": [pins["torch"]], "all": [pins["tensorflow"], pins["litert"], pins["torch"]]}
    readme = (REPO / "python" / "README.md").read_text()
    meta = [
        "Metadata-Version: 2.1",
        "Name: redisai-rs",
        f"Version: {version}",
        "Summary: Redis module for tensors, models and inference next to the data (drop-in RedisAI 1.2.7), "
        "with its backends as wheels",
        "License: BSD-3-Clause",
        "Requires-Python: >=3.9",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Programming Language :: Rust",
        "Classifier: Topic :: Database",
    ]
    meta += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in extras.items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    meta += ["Description-Content-Type: text/markdown", "", readme]
    entry_points = ("[console_scripts]\nredisai-rs = redisai_rs._cli:main\n"
                    "redisai-rs-server = redisai_rs._cli:server_main\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("redisai_rs-*.whl"):
        old.unlink()
    wheel = write_wheel(out_dir, files, "redisai-rs", version, tag, "\n".join(meta), entry_points)
    log(f"dependencies: {', '.join(requires)}; extras: "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in extras.items()))
    log(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB")
    print(wheel)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The import graph of src/ must have no cycle, and no folder may import a layer above its own (docs/design.md,
"Layout"; LAYERS below). A node is a module file
(src/exec/run.rs is `exec::run`, src/exec/mod.rs is `exec`); an edge is a path `crate::a::b::…` written in it
(in `use` or inline), to the deepest module file that path names. Test modules (`#[cfg(test)] mod tests`, to the
end of the file) are left out: tests may reach anywhere. Prints each cycle and each import of a higher layer, and
exits 1 when there is one.

    scripts/check-imports.py [--self-test] [src]      (--self-test: first check that a planted cycle is found)
"""
import re
import sys
from pathlib import Path


# The layers of docs/design.md, lowest first, by top-level module (a file or a folder of src/): a module may
# import its own layer and those below it.
LAYERS = [
    {"limits", "error", "tensor", "device", "backend_kind", "script_spec", "histogram", "stats", "config", "reply",
     "clock", "blob", "log", "caller"},
    {"admission"},
    {"backends"},
    {"isolation"},
    {"model", "script", "run_history"},
    {"exec", "rdb"},
    {"commands"},
    {"redis"},
]
# Known imports of a higher layer, to be taken out (issue 33's seam): a model starts its own deferred build.
UPWARD_ALLOWED = {("model", "exec")}


def layer_of(mod):
    top = mod.split("::")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return None


def upward_imports(graph):
    """(module, target) pairs where the target's layer is above the module's (both known, outside lib.rs)."""
    out = []
    for mod in sorted(graph):
        lm = layer_of(mod) if mod else None
        for t in sorted(graph[mod]):
            lt = layer_of(t)
            if lm is None or lt is None or lt <= lm:
                continue
            if (mod.split("::")[0], t.split("::")[0]) not in UPWARD_ALLOWED:
                out.append((mod, t))
    return out


def module_of(src, path):
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(parts)


def code_without_tests(text):
    m = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod tests", text, re.M)
    text = text[:m.start()] if m else text
    text = re.sub(r"//[^\n]*", "", text)
    return text


def targets(text, modules):
    """Modules named by `crate::…` paths, including grouped `use crate::{a::b, c}` forms."""
    out = set()

    def walk(prefix, body):
        # body: the text after `prefix::`, either `{…}` or a path
        body = body.strip()
        if body.startswith("{"):
            depth, start, items = 0, 1, []
            for i, ch in enumerate(body):
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        items.append(body[start:i])
                        break
                elif ch == "," and depth == 1:
                    items.append(body[start:i])
                    start = i + 1
            for item in items:
                item = item.strip()
                if item:
                    walk(prefix, item)
            return
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*(::\{)?", body)
        if not m:
            return
        path = m.group(0).rstrip("{").rstrip(":")
        full = [p for p in (prefix + "::" + path if prefix else path).split("::") if p]
        if m.group(2):
            walk("::".join(full), body[len(m.group(0)) - 1:])
            return
        for i in range(len(full), 0, -1):
            name = "::".join(full[:i])
            if name in modules:
                out.add(name)
                return

    for m in re.finditer(r"\bcrate::", text):
        walk("", text[m.end():m.end() + 2000])
    # `use super::x` inside a directory module
    return out


def self_test():
    """A tree with a cycle through `super::` and a grouped `use`, and one without: the checker must tell them apart."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "src"
        (src / "exec").mkdir(parents=True)
        (src / "lib.rs").write_text("pub mod exec;\npub mod model;\npub mod error;\n")
        (src / "error.rs").write_text("pub struct E;\n")
        (src / "exec" / "mod.rs").write_text("pub mod x;\n")
        (src / "exec" / "x.rs").write_text("use crate::{model::Y, error};\n")
        (src / "model.rs").write_text("pub struct Y;\n#[cfg(test)]\nmod tests {\n    use crate::exec::x;\n}\n")
        clean = subprocess.run([sys.executable, __file__, str(src)], capture_output=True, text=True)
        (src / "model.rs").write_text("use crate::exec::x::Z;\npub struct Y;\n")
        cyclic = subprocess.run([sys.executable, __file__, str(src)], capture_output=True, text=True)
    if clean.returncode != 0 or cyclic.returncode != 1 or "exec::x, model" not in cyclic.stdout:
        sys.exit(f"check-imports self-test failed:\n{clean.stdout}{cyclic.stdout}")
    graph = {"backends::onnx": {"exec::run", "error"}, "exec::run": {"backends"}, "error": set()}
    if upward_imports(graph) != [("backends::onnx", "exec::run")]:
        sys.exit(f"check-imports self-test failed: upward imports {upward_imports(graph)}")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--self-test"]:
        self_test()
        args = args[1:]
    src = Path(args[0] if args else "src")
    files = {module_of(src, p): p for p in src.rglob("*.rs")}
    modules = set(files)
    graph = {}
    for mod, path in files.items():
        text = code_without_tests(path.read_text())
        # super:: paths, resolved against this module's parent
        parent = mod.rsplit("::", 1)[0] if "::" in mod else ""
        if path.name == "mod.rs":
            parent = mod
        text = re.sub(r"\bsuper::", "crate::" + (parent + "::" if parent and path.name != "mod.rs" else
                                                   (mod.rsplit("::", 1)[0] + "::" if "::" in mod else "")), text)
        text = re.sub(r"\bself::", "crate::" + (mod + "::" if mod else ""), text) if path.name in ("mod.rs",) else text
        graph[mod] = {t for t in targets(text, modules) if t != mod and not mod.startswith(t + "::")
                      and t != ""}
    # Tarjan's strongly connected components, iteratively.
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
    for comp in sccs:
        members = set(comp)
        print("import cycle among: " + ", ".join(comp))
        for m in comp:
            print("  %s -> %s" % (m, ", ".join(sorted(graph[m] & members))))
    upward = upward_imports(graph)
    for mod, t in upward:
        print(f"layer violation: {mod} imports {t} (a higher layer; LAYERS in scripts/check-imports.py)")
    unknown = sorted({m.split("::")[0] for m in graph if m and layer_of(m) is None})
    for top in unknown:
        print(f"module {top} is in no layer: add it to LAYERS in scripts/check-imports.py")
    if sccs or upward or unknown:
        sys.exit(1)
    print(f"imports: {len(graph)} modules, no cycle, no import of a higher layer")


if __name__ == "__main__":
    main()

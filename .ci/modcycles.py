#!/usr/bin/env python3
"""Module cycles of a Rust crate, from its source text: `.ci/run` runs it on every crate root.

usage: modcycles.py CRATE_ROOT_FILE [--edges] [--depth N]
       modcycles.py GRAPH.dot [--edges] [--depth N]   (the output of `cargo modules dependencies`)

Every module (a file, or an inline `mod name {`) gets an edge to every other module whose items
its code names through `crate::`, `super::` or `self::` paths (in `use` lines and inline),
comments and strings left out. A module's edge to its own descendants is kept (a parent that
names its child's items uses it); prints the edges behind each cycle (strongly connected
component of more than one module), or "no cycles". With `--depth N` every module is folded
into its ancestor at depth N first (`--depth 1`: the crate's top-level modules, so that
`budget -> plan::search` and `plan -> budget` make the cycle `budget, plan`).
Test code (`#[cfg(test)]` modules) is left out: tests use the crate's test harness and its
registries by design. Visibility paths (`pub(in crate::x)`) name no item and are left out too.
cargo-modules (0.27, the last for rustc 1.95) is no substitute: its `--acyclic` works on the
item graph (a type and its own method make a cycle) and misses paths inside function bodies.
"""
import os
import re
import sys


def strip(text):
    """Removes comments and string/char literals, keeping line breaks."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"' or (c == "r" and re.match(r'r#*"', text[i:i + 10])):
            m = re.match(r'r(#*)"', text[i:i + 10])
            if m:
                end = '"' + m.group(1)
                j = text.find(end, i + len(m.group(0)))
                j = n if j < 0 else j + len(end)
            else:
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            j = text.find("'", i + 2) + 1
            out.append("' '")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of names
        self.file = file
        self.children = {}
        self.code = []  # (line number, text)


def load(root_file):
    modules = {}

    def parse(path, file, text, base_dir, line0=0):
        m = Module(path, file)
        modules[path] = m
        lines = text.split("\n")
        i = 0
        depth_stack = []
        while i < len(lines):
            line = lines[i]
            mm = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*(;|\{)", line)
            if mm:
                name, kind = mm.group(1), mm.group(2)
                attrs = line + " " + (lines[i - 1] if i > 0 else "")
                is_test = "cfg(test)" in attrs
                if is_test and kind == ";":
                    i += 1
                    continue
                if is_test:
                    depth, j = 0, i
                    for j in range(i, len(lines)):
                        depth += lines[j].count("{") - lines[j].count("}")
                        if depth == 0 and "{" in "".join(lines[i:j + 1]):
                            break
                    i = j + 1
                    continue
                if kind == ";":
                    cands = [os.path.join(base_dir, name + ".rs"), os.path.join(base_dir, name, "mod.rs")]
                    f = next((c for c in cands if os.path.exists(c)), None)
                    if f:
                        sub = strip(open(f).read())
                        sub_dir = os.path.join(base_dir, name)
                        parse(path + (name,), f, sub, sub_dir)
                        m.children[name] = path + (name,)
                    i += 1
                    continue
                # inline module: take lines to the matching brace
                depth, j, body = 0, i, []
                for j in range(i, len(lines)):
                    depth += lines[j].count("{") - lines[j].count("}")
                    body.append(lines[j])
                    if depth == 0:
                        break
                inner = "\n".join(body)
                inner = inner[inner.index("{") + 1: inner.rindex("}")]
                parse(path + (name,), file, inner, os.path.join(base_dir, name), line0 + i)
                m.children[name] = path + (name,)
                i = j + 1
                continue
            m.code.append((line0 + i + 1, line))
            i += 1
        return m

    root_text = strip(open(root_file).read())
    parse((), root_file, root_text, os.path.dirname(root_file))
    return modules


def resolve(modules, here, segments):
    """The module a path (list of segments, starting at crate/super/self) lands in."""
    if segments[0] == "crate":
        cur, rest = (), segments[1:]
    else:
        cur, rest = here, segments
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                cur = cur[:-1]
            rest = rest[1:]
    for s in rest:
        nxt = cur + (s,)
        if nxt in modules:
            cur = nxt
        else:
            break
    return cur


PATH = re.compile(r"\b((?:crate|super|self)(?:::\w+)+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.S)


def expand_use(tree):
    """Expands `a::{b, c::{d}}` into paths."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)::\{(.*)\}$", tree)
    if not m:
        return [re.sub(r"::(\*|\w+as\w+)$", lambda x: "" if x.group(1) == "*" else "::" + x.group(1).split("as")[0], tree)]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        parts.append(cur)
    out = []
    for p in parts:
        if p in ("self", "*"):
            out.append(prefix)
        else:
            out.extend(expand_use(prefix + "::" + p))
    return out


def edges(modules):
    es = {}
    for path, m in modules.items():
        text = "\n".join(l for _, l in m.code)
        text = re.sub(r"\bpub\(in\s+[\w:]+\)", "pub", text)
        found = []
        for u in USE.finditer(text):
            for p in expand_use(u.group(1)):
                found.append((p, text[:u.start()].count("\n")))
        body = USE.sub(lambda x: "\n" * x.group(0).count("\n"), text)
        for p in PATH.finditer(body):
            found.append((p.group(1), body[:p.start()].count("\n")))
        # Paths through a child module by its bare name (`routes::post_plan`, `use store::X`).
        if m.children:
            names = "|".join(map(re.escape, m.children))
            bare = re.compile(r"(?<![\w:])((?:" + names + r")(?:::\w+|::\{[^;]*?\})+)")
            for p in bare.finditer(text):
                for q in expand_use(p.group(1)) if "{" in p.group(1) else [p.group(1)]:
                    found.append(("self::" + q, text[:p.start()].count("\n")))
        for p, idx in found:
            segs = p.split("::")
            target = resolve(modules, path, segs)
            if target == path or path[:len(target)] == target and len(target) < len(path) and segs[0] == "self":
                continue
            if target == path:
                continue
            line = m.code[idx][0] if idx < len(m.code) else 0
            es.setdefault((path, target), []).append(f"{os.path.relpath(m.file)}:{line}: {p}")
    return es


def sccs(nodes, adj):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def name(p):
    return "crate" if not p else "::".join(p)


def main():
    root = sys.argv[1]
    modules = load(root)
    es = edges(modules)
    if "--depth" in sys.argv:
        d = int(sys.argv[sys.argv.index("--depth") + 1])
        folded = {}
        for (a, b), where in es.items():
            a2, b2 = a[:d], b[:d]
            if a2 != b2 and not (a2[:len(b2)] == b2 or b2[:len(a2)] == a2):
                folded.setdefault((a2, b2), []).extend(where)
        es = folded
        modules = {k[:d]: v for k, v in modules.items()}
    adj = {}
    for (a, b) in es:
        adj.setdefault(a, set()).add(b)
    if "--edges" in sys.argv:
        for (a, b) in sorted(es):
            print(f"{name(a)} -> {name(b)}")
    cycles = [c for c in sccs(list(modules), adj) if len(c) > 1]
    if not cycles:
        print(f"{root}: {len(modules)} modules, {len(es)} module-to-module uses, no cycles")
        return 0
    for comp in cycles:
        cs = set(comp)
        print(f"cycle: {', '.join(sorted(name(c) for c in comp))}")
        for (a, b), where in sorted(es.items()):
            if a in cs and b in cs:
                print(f"  {name(a)} -> {name(b)}: {where[0]}" + (f" (+{len(where) - 1} more)" if len(where) > 1 else ""))
    return 1


if __name__ == "__main__":
    sys.exit(main())

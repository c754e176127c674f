#!/usr/bin/env python3
"""The public API of each crate published to crates.io, as text: every public item with its
signature, from rustdoc's JSON output. `crates/<crate>/api.txt` holds each report, so that a
change to the API shows in review as a change to that file.

    .ci/api-report.py           writes the reports
    .ci/api-report.py --check   fails if a report is not what the code gives

rustdoc's JSON output is unstable in Rust; RUSTC_BOOTSTRAP lets the stable toolchain write it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["broker-core", "broker-net", "broker-proto", "broker-client"]
# The version of rustdoc's JSON format this script reads; another toolchain may write another.
FORMAT_VERSION = 57


def target_dir():
    metadata = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                              cwd=ROOT, check=True, capture_output=True).stdout
    return Path(json.loads(metadata)["target_directory"])


def build(crate):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    subprocess.run(
        ["cargo", "rustdoc", "--quiet", "--locked", "-p", crate, "--lib", "--",
         "-Z", "unstable-options", "--output-format", "json"],
        cwd=ROOT, env=env, check=True)
    doc = json.loads((target_dir() / "doc" / (crate.replace("-", "_") + ".json")).read_text())
    if doc["format_version"] != FORMAT_VERSION:
        sys.exit(f"rustdoc wrote JSON format {doc['format_version']}; .ci/api-report.py reads "
                 f"format {FORMAT_VERSION}: update the script (and the reports) for it")
    return doc


class Report:
    def __init__(self, doc):
        self.doc = doc
        self.index = doc["index"]
        self.lines = []

    def item(self, id_):
        return self.index.get(str(id_))

    # Types.
    def ty(self, t):
        if t is None:
            return "()"
        (kind, v), = t.items()
        if kind == "resolved_path":
            # The name alone: a path as spelled at the use site changes with refactors.
            return v["path"].rsplit("::", 1)[-1] + self.args(v.get("args"))
        if kind == "primitive" or kind == "generic":
            return v
        if kind == "borrowed_ref":
            life = (v["lifetime"] + " ") if v.get("lifetime") else ""
            return "&" + life + ("mut " if v["is_mutable"] else "") + self.ty(v["type"])
        if kind == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(v["type"])
        if kind == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ("," if len(v) == 1 else "") + ")"
        if kind == "slice":
            return "[" + self.ty(v) + "]"
        if kind == "array":
            return "[" + self.ty(v["type"]) + "; " + v["len"] + "]"
        if kind == "impl_trait":
            return "impl " + self.bounds(v)
        if kind == "dyn_trait":
            return "dyn " + " + ".join(self.poly(p) for p in v["traits"])
        if kind == "qualified_path":
            trait = v.get("trait")
            self_ty = self.ty(v["self_type"])
            if trait:
                return "<" + self_ty + " as " + trait["path"] + ">::" + v["name"]
            return self_ty + "::" + v["name"]
        if kind == "function_pointer":
            return "fn(" + ", ".join(self.ty(x[1]) for x in v["sig"]["inputs"]) + ")" + \
                self.output(v["sig"]["output"])
        return kind

    def poly(self, p):
        return self.name(p["trait"]) + self.args(p["trait"].get("args"))

    @staticmethod
    def name(path):
        return path["path"].rsplit("::", 1)[-1]

    def args(self, args):
        if not args:
            return ""
        if "angle_bracketed" in args:
            ab = args["angle_bracketed"]
            parts = []
            for a in ab["args"]:
                (k, v), = a.items()
                parts.append(self.ty(v) if k == "type" else v if k == "lifetime" else str(v))
            for c in ab.get("constraints", []):
                binding = c.get("binding", {})
                if "equality" in binding:
                    eq = binding["equality"]
                    parts.append(c["name"] + " = " + (self.ty(eq["type"]) if "type" in eq else str(eq)))
                else:
                    parts.append(c["name"] + ": " + self.bounds(binding.get("constraint", [])))
            return "<" + ", ".join(parts) + ">" if parts else ""
        if "parenthesized" in args:
            p = args["parenthesized"]
            return "(" + ", ".join(self.ty(x) for x in p["inputs"]) + ")" + self.output(p.get("output"))
        return ""

    def output(self, out):
        return "" if out is None else " -> " + self.ty(out)

    def bounds(self, bounds):
        parts = []
        for b in bounds:
            if "trait_bound" in b:
                tb = b["trait_bound"]
                modifier = "?" if tb.get("modifier") == "maybe" else ""
                parts.append(modifier + self.name(tb["trait"]) + self.args(tb["trait"].get("args")))
            elif "outlives" in b:
                parts.append(b["outlives"])
            elif "use" in b:
                parts.append("use<..>")
        return " + ".join(parts)

    def generics(self, g):
        params = []
        for p in g.get("params", []):
            kind = p["kind"]
            if "type" in kind:
                if kind["type"].get("is_synthetic"):
                    continue
                b = self.bounds(kind["type"].get("bounds", []))
                params.append(p["name"] + (": " + b if b else ""))
            elif "lifetime" in kind:
                params.append(p["name"])
            elif "const" in kind:
                params.append("const " + p["name"] + ": " + self.ty(kind["const"]["type"]))
        where = []
        for w in g.get("where_predicates", []):
            if "bound_predicate" in w:
                bp = w["bound_predicate"]
                where.append(self.ty(bp["type"]) + ": " + self.bounds(bp["bounds"]))
        return ("<" + ", ".join(params) + ">" if params else ""), \
            (" where " + ", ".join(where) if where else "")

    def function(self, name, f):
        header = f["header"]
        prefix = ("const " if header["is_const"] else "") + ("async " if header["is_async"] else "") + \
            ("unsafe " if header["is_unsafe"] else "")
        params, where = self.generics(f["generics"])
        inputs = []
        for arg, t in f["sig"]["inputs"]:
            if arg == "self":
                rendered = self.ty(t)
                inputs.append({"Self": "self", "&Self": "&self", "&mut Self": "&mut self"}.get(
                    rendered, "self: " + rendered))
            else:
                inputs.append(arg + ": " + self.ty(t))
        return "pub " + prefix + "fn " + name + params + "(" + ", ".join(inputs) + ")" + \
            self.output(f["sig"]["output"]) + where

    # Items.
    def emit(self, text):
        self.lines.append(text)

    def impls(self, path, type_id, impl_ids):
        traits = []
        for impl_id in impl_ids:
            impl = self.item(impl_id)
            if impl is None:
                continue
            inner = impl["inner"]["impl"]
            # Blanket impls come with the traits'; impls for other types that name this one
            # (`From<This> for Other`) are listed under those.
            for_id = inner["for"].get("resolved_path", {}).get("id")
            if inner.get("blanket_impl") is not None or for_id != type_id:
                continue
            if inner.get("trait") is None:
                for method_id in inner["items"]:
                    m = self.item(method_id)
                    if m is None or m.get("visibility") != "public":
                        continue
                    (kind, v), = m["inner"].items()
                    if kind == "function":
                        self.emit(self.function(path + "::" + m["name"], v))
                    elif kind == "assoc_const":
                        self.emit("pub const " + path + "::" + m["name"] + ": " + self.ty(v["type"]))
            else:
                trait = inner["trait"]
                # Marker traits of the compiler's own, which no user code names.
                if self.name(trait) in ("StructuralPartialEq", "Freeze", "UnsafeUnpin"):
                    continue
                for_type = inner["for"].get("resolved_path", {})
                assoc = []
                for member_id in inner["items"]:
                    member = self.item(member_id)
                    if member is not None and "assoc_type" in member["inner"]:
                        bound = member["inner"]["assoc_type"].get("type")
                        assoc.append("type " + member["name"] + " = " + self.ty(bound))
                negative = "!" if inner.get("is_negative") else ""
                traits.append("impl" + self.generics(inner["generics"])[0] + " " + negative +
                              self.name(trait) + self.args(trait.get("args")) + " for " + path +
                              self.args(for_type.get("args")) +
                              (" { " + "; ".join(assoc) + " }" if assoc else ""))
        for line in sorted(set(traits)):
            self.emit(line)

    def module(self, path, module_id, seen):
        module = self.item(module_id)
        entries = []
        for id_ in module["inner"]["module"]["items"]:
            it = self.item(id_)
            if it is None or it.get("visibility") != "public":
                continue
            entries.append(it)
        entries.sort(key=lambda it: (it.get("name") or it["inner"].get("use", {}).get("name", ""), str(it["id"])))
        for it in entries:
            (kind, v), = it["inner"].items()
            name = it.get("name")
            full = path + "::" + name if name else path
            if kind == "use":
                target = self.item(v["id"]) if v.get("id") is not None else None
                if target is not None and target["crate_id"] == 0 and v["id"] not in seen:
                    seen.add(v["id"])
                    self.one(path + "::" + v["name"], target, seen)
                else:
                    self.emit("pub use " + path + "::" + v["name"] + " = " + v["source"]
                              + ("::*" if v.get("is_glob") else ""))
            else:
                if it["id"] in seen:
                    continue
                seen.add(it["id"])
                self.one(full, it, seen)

    def one(self, full, it, seen):
        (kind, v), = it["inner"].items()
        if kind == "module":
            self.emit("pub mod " + full)
            self.module(full, it["id"], seen)
        elif kind == "function":
            self.emit(self.function(full, v))
        elif kind == "constant":
            self.emit("pub const " + full + ": " + self.ty(v["type"]))
        elif kind == "static":
            self.emit("pub static " + full + ": " + self.ty(v["type"]))
        elif kind == "type_alias":
            params, where = self.generics(v["generics"])
            self.emit("pub type " + full + params + " = " + self.ty(v["type"]) + where)
        elif kind == "struct":
            params, where = self.generics(v["generics"])
            attrs = " #[non_exhaustive]" if any("non_exhaustive" in str(a) for a in it.get("attrs", [])) else ""
            skind = v["kind"]
            fields = []
            if "plain" in skind:
                fields = skind["plain"]["fields"]
                if skind["plain"].get("has_stripped_fields"):
                    attrs += " (and private fields)"
            elif "tuple" in skind:
                fields = [f for f in skind["tuple"] if f is not None]
                if None in skind["tuple"]:
                    attrs += " (and private fields)"
            self.emit("pub struct " + full + params + where + attrs)
            for fid in fields:
                f = self.item(fid)
                if f is not None and f.get("visibility") == "public":
                    self.emit(full + "::" + f["name"] + ": " + self.ty(f["inner"]["struct_field"]))
            self.impls(full, it["id"], v["impls"])
        elif kind == "enum":
            params, where = self.generics(v["generics"])
            attrs = " #[non_exhaustive]" if any("non_exhaustive" in str(a) for a in it.get("attrs", [])) else ""
            self.emit("pub enum " + full + params + where + attrs)
            for vid in v["variants"]:
                var = self.item(vid)
                vk = var["inner"]["variant"]["kind"]
                if vk == "plain":
                    self.emit(full + "::" + var["name"])
                elif "tuple" in vk:
                    types = [self.ty(self.item(f)["inner"]["struct_field"]) for f in vk["tuple"] if f is not None]
                    self.emit(full + "::" + var["name"] + "(" + ", ".join(types) + ")")
                elif "struct" in vk:
                    fields = [self.item(f) for f in vk["struct"]["fields"]]
                    self.emit(full + "::" + var["name"] + " { " + ", ".join(
                        f["name"] + ": " + self.ty(f["inner"]["struct_field"]) for f in fields) + " }")
            self.impls(full, it["id"], v["impls"])
        elif kind == "trait":
            params, where = self.generics(v["generics"])
            supertraits = self.bounds(v.get("bounds", []))
            self.emit("pub trait " + full + params + (": " + supertraits if supertraits else "") +
                      where)
            for mid in v["items"]:
                m = self.item(mid)
                (mk, mv), = m["inner"].items()
                if mk == "function":
                    provided = " (provided)" if mv.get("has_body") else ""
                    self.emit(self.function(full + "::" + m["name"], mv).replace("pub ", "", 1) +
                              provided)
                elif mk == "assoc_type":
                    self.emit("type " + full + "::" + m["name"])
                elif mk == "assoc_const":
                    self.emit("const " + full + "::" + m["name"] + ": " + self.ty(mv["type"]))
            implementors = []
            for impl_id in v.get("implementations", []):
                impl = self.item(impl_id)
                if impl is not None and impl["inner"]["impl"].get("blanket_impl") is None:
                    implementors.append("impl " + self.name({"path": full}) + " for " +
                                        self.ty(impl["inner"]["impl"]["for"]))
            for line in sorted(set(implementors)):
                self.emit(line)
        elif kind == "macro":
            self.emit("macro " + full + "!")
        else:
            self.emit(kind + " " + full)


def report(crate):
    doc = build(crate)
    r = Report(doc)
    name = crate.replace("-", "_")
    r.emit("pub mod " + name)
    r.module(name, doc["root"], set())
    return "# The public API of " + crate + ", written by .ci/api-report.py: do not edit.\n\n" + \
        "\n".join(r.lines) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    stale = []
    for crate in CRATES:
        path = ROOT / "crates" / crate / "api.txt"
        text = report(crate)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(crate)
                subprocess.run(["diff", "-u", str(path), "-"], input=text.encode())
        else:
            path.write_text(text)
    if stale:
        sys.exit("the public API of " + ", ".join(stale) + " changed: if that is meant, run "
                 ".ci/api-report.py and commit crates/*/api.txt (a change that removes or "
                 "changes a line breaks users of the crate)")


if __name__ == "__main__":
    main()

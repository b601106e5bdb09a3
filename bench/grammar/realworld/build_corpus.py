#!/usr/bin/env python3
"""Builds coli-grammar's large real-world JSON Schema corpus from public packages.

Fixture generation only: neither the tests nor the product import Python. The sources
are published packages fetched from PyPI and npm (versions pinned in `sources.txt`):

- SchemaStore schemas vendored by `check-jsonschema` (CI configs, compose, renovate, ...);
- Kubernetes 1.36 strict schemas from `kubernetes-validate` (each kind with the closure of
  the definitions it references, refs rewritten to `#/$defs/...`);
- GitHub's REST API component schemas and webhook payloads (`@octokit/openapi`,
  `@octokit/openapi-webhooks`), each with the closure of the components it references
  under `components/schemas`, OpenAPI 3.0's `nullable: true` written as a `null` type as
  OpenAPI-to-JSON-Schema converters do; the spec's own response examples are valid
  instances where the response names the schema directly;
- function-calling parameter schemas from the Berkeley Function Calling Leaderboard
  (`bfcl-eval`), its non-standard types mapped (dict -> object, float -> number,
  tuple -> array, any -> no type) as a client sending them to an OpenAI-style API must.

Instances: valid ones from `hypothesis-jsonschema` (an independent generator) plus the
examples above; near-miss invalid ones by mutating valid ones (a required member
dropped, a leaf of another type, an enum value changed, an undeclared member added, a
number pushed out of range, a string lengthened or emptied). Every label is checked by
the Python `jsonschema` validator (draft from `$schema`, else 2020-12, formats checked);
instances it disagrees with are dropped. The Rust side re-checks each label with the
`jsonschema` crate.

Usage: build_corpus.py SRC_DIR OUT.jsonl [--limit N]
"""

import copy
import glob
import json
import os
import random
import re
import multiprocessing
import sys
import warnings

import jsonschema
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis_jsonschema import from_schema

warnings.filterwarnings("ignore")

VALID_PER_SCHEMA = 3
INVALID_PER_SCHEMA = 4
GEN_SECONDS = 4


# ---------------------------------------------------------------- sources


def refs_in(v, out):
    if isinstance(v, dict):
        r = v.get("$ref")
        if isinstance(r, str):
            out.add(r)
        for x in v.values():
            refs_in(x, out)
    elif isinstance(v, list):
        for x in v:
            refs_in(x, out)


def closure(start, table, prefix):
    """Names in `table` reachable from `start` through refs starting with `prefix`."""
    seen, todo = set(), [start]
    while todo:
        refs = set()
        refs_in(todo.pop(), refs)
        for r in refs:
            if r.startswith(prefix):
                name = r[len(prefix):]
                if name in table and name not in seen:
                    seen.add(name)
                    todo.append(table[name])
    return seen


def nullable_to_type(v):
    if isinstance(v, dict):
        out = {k: nullable_to_type(x) for k, x in v.items() if k != "nullable"}
        if v.get("nullable") is True:
            t = out.get("type")
            if isinstance(t, str):
                out["type"] = [t, "null"]
            elif isinstance(t, list) and "null" not in t:
                out["type"] = t + ["null"]
            elif "enum" in out and None not in out["enum"]:
                out["enum"] = out["enum"] + [None]
        return out
    if isinstance(v, list):
        return [nullable_to_type(x) for x in v]
    return v


def schemastore(src):
    d = glob.glob(f"{src}/check_jsonschema/check_jsonschema/builtin_schemas/vendor/*.json")
    for f in sorted(d):
        yield "schemastore/" + os.path.basename(f)[:-5], json.load(open(f)), []


def kubernetes(src):
    base = glob.glob(f"{src}/kubernetes_validate/kubernetes_validate/kubernetes-json-schema/v1.36.0-local-strict")[0]
    prefix = "/api/_definitions.json#/$defs/"

    def rewrite(v):
        if isinstance(v, dict):
            return {
                k: ("#/$defs/" + x[len(prefix):] if k == "$ref" and isinstance(x, str) and x.startswith(prefix) else rewrite(x))
                for k, x in v.items()
            }
        if isinstance(v, list):
            return [rewrite(x) for x in v]
        return v

    defs = rewrite(json.load(open(f"{base}/_definitions.json"))["$defs"])
    for f in sorted(glob.glob(f"{base}/*.json")):
        name = os.path.basename(f)[:-5]
        if name.startswith("_") or name == "all" or name.endswith("list") or "-list-" in name:
            continue
        s = rewrite(json.load(open(f)))
        need = closure(s, defs, "#/$defs/")
        if need:
            s["$defs"] = {n: defs[n] for n in sorted(need)}
        yield "kubernetes/" + name, s, []


def openapi(path, tag):
    d = json.load(open(path))
    comps = d.get("components", {})
    schemas = comps.get("schemas", {})
    examples = comps.get("examples", {})
    prefix = "#/components/schemas/"
    found = {}

    def walk_responses(ops):
        for op in ops:
            if not isinstance(op, dict):
                continue
            for resp in op.get("responses", {}).values():
                content = resp.get("content", {}).get("application/json", {}) if isinstance(resp, dict) else {}
                r = content.get("schema", {}).get("$ref", "")
                if not r.startswith(prefix):
                    continue
                for ex in content.get("examples", {}).values():
                    er = ex.get("$ref", "")
                    if er.startswith("#/components/examples/"):
                        v = examples.get(er.split("/")[-1], {}).get("value")
                        if v is not None:
                            found.setdefault(r[len(prefix):], []).append(v)

    for item in list(d.get("paths", {}).values()) + list(d.get("webhooks", {}).values()):
        if isinstance(item, dict):
            walk_responses(item.values())
    for name in sorted(schemas):
        s = copy.deepcopy(schemas[name])
        need = closure(s, schemas, prefix)
        if need:
            s["components"] = {"schemas": {n: schemas[n] for n in sorted(need)}}
        yield f"{tag}/{name}", nullable_to_type(s), found.get(name, [])


BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def bfcl_types(v):
    if isinstance(v, dict):
        out = {k: bfcl_types(x) for k, x in v.items()}
        t = out.get("type")
        if t == "any":
            del out["type"]
        elif isinstance(t, str) and t in BFCL_TYPES:
            out["type"] = BFCL_TYPES[t]
        return out
    if isinstance(v, list):
        return [bfcl_types(x) for x in v]
    return v


def bfcl(src):
    seen = set()
    for f in sorted(glob.glob(f"{src}/bfcl_eval/bfcl_eval/data/BFCL_v4_*.json")):
        for line in open(f):
            try:
                case = json.loads(line)
            except ValueError:
                continue
            funcs = case.get("function", [])
            for fn in funcs if isinstance(funcs, list) else []:
                if not isinstance(fn, dict) or "parameters" not in fn:
                    continue
                key = json.dumps(fn["parameters"], sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                yield f"bfcl/{fn.get('name', 'fn')}", bfcl_types(fn["parameters"]), []


# ---------------------------------------------------------------- instances


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def for_generation(v):
    """The schema with every local reference under `definitions`: the generator's
    resolver finds `#/definitions/...` but not `$defs` or OpenAPI components."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if k == "$ref" and isinstance(x, str):
                x = x.replace("#/$defs/", "#/definitions/").replace("#/components/schemas/", "#/definitions/")
                out[k] = x
            elif k == "$defs":
                out.setdefault("definitions", {}).update(for_generation(x))
            elif k == "components" and isinstance(x, dict) and "schemas" in x:
                out.setdefault("definitions", {}).update(for_generation(x["schemas"]))
            else:
                out[k] = for_generation(x)
        return out
    if isinstance(v, list):
        return [for_generation(x) for x in v]
    return v


def generate_here(schema, n, conn):
    out = []

    @settings(
        max_examples=n * 4,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @seed(17)
    @given(from_schema(for_generation(schema)))
    def draw(x):
        if len(out) < n * 4 and x not in out:
            out.append(x)

    try:
        draw()
    except Exception:  # the generator refuses many real schemas; that is fine
        pass
    conn.send(json.dumps(out))
    conn.close()


def generate(schema, n):
    """Up to `n` instances from hypothesis-jsonschema, in a child process killed after
    GEN_SECONDS (the generator can hang on large schemas)."""
    parent, child = multiprocessing.Pipe(duplex=False)
    p = multiprocessing.Process(target=generate_here, args=(schema, n, child))
    p.start()
    child.close()
    out = []
    if parent.poll(GEN_SECONDS):
        try:
            out = json.loads(parent.recv())
        except (EOFError, ValueError):
            pass
    p.kill()
    p.join()
    # prefer the larger ones: hypothesis starts from minimal examples
    out.sort(key=lambda x: -len(json.dumps(x)))
    return out[:n]


def leaves(v, path=()):
    yield path, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from leaves(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from leaves(x, path + (i,))


def set_at(v, path, new):
    v = copy.deepcopy(v)
    if not path:
        return new
    cur = v
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = new
    return v


def del_at(v, path):
    v = copy.deepcopy(v)
    cur = v
    for p in path[:-1]:
        cur = cur[p]
    if isinstance(cur, dict):
        del cur[path[-1]]
    else:
        cur.pop(path[-1])
    return v


def other_type(x):
    if isinstance(x, bool):
        return "true"
    if isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, str):
        return 7
    if x is None:
        return 0
    if isinstance(x, list):
        return {"0": x[0]} if x else {}
    return [x]


def mutations(inst, rng):
    spots = list(leaves(inst))
    rng.shuffle(spots)
    for path, x in spots[:12]:
        yield set_at(inst, path, other_type(x))
        if path:
            yield del_at(inst, path)
        if isinstance(x, dict):
            y = dict(x)
            y["zz_undeclared"] = 1
            yield set_at(inst, path, y)
        if isinstance(x, str):
            yield set_at(inst, path, "")
            yield set_at(inst, path, x + "~x")
            yield set_at(inst, path, x * 40 + "!")
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            yield set_at(inst, path, x + 1e12)
            yield set_at(inst, path, -x - 1e12)
            yield set_at(inst, path, x + 0.5)
        if isinstance(x, list):
            yield set_at(inst, path, [])
            yield set_at(inst, path, x + x)


def build(name, schema, examples, rng):
    try:
        v = validator(schema)
    except Exception:
        return None
    valid = []
    for e in examples:
        try:
            if v.is_valid(e) and e not in valid:
                valid.append(e)
        except Exception:
            pass
    valid = valid[:2]
    for e in generate(schema, VALID_PER_SCHEMA):
        try:
            if v.is_valid(e) and e not in valid:
                valid.append(e)
        except Exception:
            pass
    invalid = []
    for inst in valid:
        for m in mutations(inst, rng):
            if len(invalid) >= INVALID_PER_SCHEMA:
                break
            try:
                if m not in invalid and not v.is_valid(m):
                    invalid.append(m)
            except Exception:
                pass
    return {"name": name, "schema": schema, "valid": valid, "invalid": invalid}


def main():
    src, out = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[sys.argv.index("--limit") + 1]) if "--limit" in sys.argv else None
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    rng = random.Random(17)
    gh = f"{src}/octokit-openapi-23.0.2/package/generated/api.github.com.json"
    hooks = f"{src}/octokit-openapi-webhooks-12.1.0/package/generated/api.github.com.json"
    sources = [
        ("schemastore", lambda: schemastore(src)),
        ("kubernetes", lambda: kubernetes(src)),
        ("github", lambda: openapi(gh, "github")),
        ("webhooks", lambda: openapi(hooks, "webhooks")),
        ("bfcl", lambda: bfcl(src)),
    ]
    n = 0
    with open(out, "w") as f:
        for tag, gen in sources:
            if only and tag != only:
                continue
            k = 0
            for name, schema, examples in gen():
                if limit is not None and k >= limit:
                    break
                k += 1
                row = build(name, schema, examples, rng)
                if row is None:
                    continue
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                n += 1
                if n % 100 == 0:
                    print(f"{n} schemas", file=sys.stderr)
    print(f"wrote {n} schemas to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

# Writes the real-world-shaped corpus (run in this directory: python3 generate.py).
# Labels are checked against the jsonschema crate by tests/realworld.rs.
import json, os
C = {}
def add(name, schema, valid, invalid, valid_texts=()):
    C[name] = {"schema": schema, "valid": valid, "invalid": invalid}
    if valid_texts:
        C[name]["valid_texts"] = list(valid_texts)

# 1. Kubernetes Deployment-like (draft-04 id, x-kubernetes-*, definitions, $ref, int-or-string)
k8s_defs = {
  "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"format": "int-or-string", "oneOf": [{"type": "string"}, {"type": "integer"}], "x-kubernetes-int-or-string": True},
  "io.k8s.api.core.v1.ContainerPort": {"description": "ContainerPort represents a network port.", "properties": {
      "containerPort": {"format": "int32", "type": "integer", "minimum": 1, "maximum": 65535},
      "name": {"type": "string"}, "protocol": {"type": "string", "enum": ["TCP", "UDP", "SCTP"], "default": "TCP"}},
      "required": ["containerPort"], "type": "object"},
  "io.k8s.api.core.v1.EnvVar": {"properties": {"name": {"type": "string"}, "value": {"type": "string"}}, "required": ["name"], "type": "object"},
  "io.k8s.api.core.v1.Container": {"properties": {
      "name": {"type": "string"}, "image": {"type": "string"},
      "args": {"items": {"type": "string"}, "type": "array"},
      "ports": {"items": {"$ref": "#/definitions/io.k8s.api.core.v1.ContainerPort"}, "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["containerPort", "protocol"]},
      "env": {"items": {"$ref": "#/definitions/io.k8s.api.core.v1.EnvVar"}, "type": "array", "x-kubernetes-patch-merge-key": "name"},
      "resources": {"properties": {"limits": {"additionalProperties": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}, "type": "object"},
                                   "requests": {"additionalProperties": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}, "type": "object"}}, "type": "object"},
      "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"], "type": "string"}},
      "required": ["name"], "type": "object"},
  "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
      "labels": {"additionalProperties": {"type": "string"}, "type": "object"}, "annotations": {"additionalProperties": {"type": "string"}, "type": "object"}}, "type": "object"},
}
deployment = {"id": "io.k8s.api.apps.v1.Deployment", "$schema": "http://json-schema.org/schema#", "definitions": k8s_defs,
  "description": "Deployment enables declarative updates for Pods and ReplicaSets.", "type": "object",
  "required": ["apiVersion", "kind", "metadata", "spec"],
  "properties": {
    "apiVersion": {"type": "string", "enum": ["apps/v1"]}, "kind": {"type": "string", "enum": ["Deployment"]},
    "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
    "spec": {"type": "object", "required": ["selector", "template"], "properties": {
        "replicas": {"type": "integer", "format": "int32", "minimum": 0},
        "selector": {"type": "object", "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "strategy": {"type": "object", "properties": {"type": {"enum": ["Recreate", "RollingUpdate"]},
             "rollingUpdate": {"type": "object", "properties": {"maxSurge": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}, "maxUnavailable": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}}}}},
        "template": {"type": "object", "properties": {"metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
             "spec": {"type": "object", "required": ["containers"], "properties": {"containers": {"type": "array", "items": {"$ref": "#/definitions/io.k8s.api.core.v1.Container"}},
                  "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]}, "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}},
    "status": {"type": "object", "readOnly": True}},
  "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Deployment", "version": "v1"}]}
dep_ok = {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"name": "web", "labels": {"app": "web", "tier": "frontend"}},
  "spec": {"template": {"spec": {"containers": [{"image": "nginx:1.25", "name": "nginx", "ports": [{"containerPort": 80, "protocol": "TCP"}],
      "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": 1}}, "env": [{"name": "MODE", "value": "prod"}, {"name": "EMPTY"}]}]},
      "metadata": {"labels": {"app": "web"}}}, "replicas": 3, "selector": {"matchLabels": {"app": "web"}},
      "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}}}}
dep_min = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}, "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}
import copy
def mut(o, f):
    o = copy.deepcopy(o); f(o); return o
add("01-k8s-deployment", deployment, [dep_ok, dep_min],
    [mut(dep_ok, lambda o: o["spec"]["template"]["spec"]["containers"][0]["ports"][0].__setitem__("containerPort", 70000)),
     mut(dep_ok, lambda o: o.__setitem__("kind", "Pod")),
     mut(dep_ok, lambda o: o["spec"].pop("selector")),
     mut(dep_ok, lambda o: o["spec"]["template"]["spec"]["containers"][0].pop("name")),
     mut(dep_ok, lambda o: o["metadata"]["labels"].__setitem__("n", 1)),
     mut(dep_ok, lambda o: o["spec"]["strategy"]["rollingUpdate"].__setitem__("maxSurge", 2.5)),
     mut(dep_ok, lambda o: o["spec"].__setitem__("replicas", -1))])

# 2. package.json-like (SchemaStore)
pkg = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "JSON schema for NPM package.json files",
  "definitions": {
    "person": {"description": "A person who has been involved in creating or maintaining this package.",
      "type": ["object", "string"], "required": ["name"], "properties": {"name": {"type": "string"}, "url": {"type": "string", "format": "uri"}, "email": {"type": "string", "format": "email"}}},
    "dependency": {"description": "Dependencies are specified with a simple hash of package name to version range.", "type": "object", "additionalProperties": {"type": "string"}},
    "scriptsInstallAfter": {"type": "string", "x-intellij-language-injection": "Shell Script"}},
  "type": "object", "patternProperties": {"^_": {"description": "Any property starting with _ is valid.", "tsType": "any"}},
  "properties": {
    "name": {"type": "string", "maxLength": 214, "minLength": 1, "pattern": "^(?:(?:@(?:[a-z0-9-*~][a-z0-9-*._~]*)?/[a-z0-9-._~])|[a-z0-9-~])[a-z0-9-._~]*$"},
    "version": {"type": "string"}, "description": {"type": "string"},
    "keywords": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    "homepage": {"type": "string"}, "license": {"anyOf": [{"type": "string"}, {"enum": ["MIT", "ISC", "Apache-2.0", "UNLICENSED"]}]},
    "author": {"$ref": "#/definitions/person"}, "contributors": {"type": "array", "items": {"$ref": "#/definitions/person"}},
    "main": {"type": "string"}, "bin": {"type": ["string", "object"], "additionalProperties": {"type": "string"}},
    "repository": {"type": ["object", "string"], "properties": {"type": {"type": "string"}, "url": {"type": "string"}, "directory": {"type": "string"}}},
    "scripts": {"type": "object", "properties": {"postinstall": {"$ref": "#/definitions/scriptsInstallAfter"}}, "additionalProperties": {"type": "string"}},
    "dependencies": {"$ref": "#/definitions/dependency"}, "devDependencies": {"$ref": "#/definitions/dependency"},
    "engines": {"type": "object", "additionalProperties": {"type": "string"}},
    "private": {"oneOf": [{"type": "boolean"}, {"enum": ["false", "true"]}]},
    "workspaces": {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "object", "properties": {"packages": {"type": "array", "items": {"type": "string"}}}}]}},
  "anyOf": [{"type": "object", "not": {"required": ["bundledDependencies", "bundleDependencies"]}}, {"type": "object", "not": {"required": ["bundleDependencies"]}, "required": ["bundledDependencies"]}]}
pkg_ok = {"version": "1.2.3", "name": "@scope/my-pkg", "private": True, "description": "A package",
  "keywords": ["a", "b"], "license": "MIT", "author": {"name": "Ann", "email": "ann@example.com"}, "contributors": ["Bob <bob@example.com>"],
  "bin": {"tool": "./bin/tool.js"}, "repository": "github:user/repo", "scripts": {"test": "jest", "postinstall": "node x.js"},
  "dependencies": {"lodash": "^4.17.21"}, "engines": {"node": ">=18"}, "_resolved": "x", "workspaces": ["packages/*"]}
add("02-package-json", pkg, [pkg_ok, {"name": "x"}, {}],
    [mut(pkg_ok, lambda o: o.__setitem__("name", "Upper Case")),
     mut(pkg_ok, lambda o: o.__setitem__("keywords", ["a", "a"])),
     mut(pkg_ok, lambda o: o.__setitem__("author", {"email": "x@y.zz"})),
     mut(pkg_ok, lambda o: o["dependencies"].__setitem__("lodash", 4)),
     mut(pkg_ok, lambda o: o.update({"bundledDependencies": [], "bundleDependencies": []})),
     mut(pkg_ok, lambda o: o.__setitem__("name", ""))])

# 3. tsconfig-like: allOf of definitions, many optional properties, enums
ts = {"$schema": "http://json-schema.org/draft-04/schema#", "id": "https://json.schemastore.org/tsconfig",
  "definitions": {
    "compilerOptionsDefinition": {"properties": {"compilerOptions": {"type": "object", "properties": {
        "target": {"type": "string", "enum": ["ES3", "ES5", "ES2015", "ES2020", "ESNext", "es5", "es2020", "esnext"]},
        "module": {"type": "string", "anyOf": [{"enum": ["CommonJS", "ESNext", "commonjs", "esnext", "node16"]}, {"pattern": "^([Cc][Oo][Mm][Mm][Oo][Nn][Jj][Ss])$"}]},
        "strict": {"type": "boolean", "default": False, "markdownDescription": "Enable all strict type-checking options."},
        "outDir": {"type": "string"}, "rootDir": {"type": "string"}, "declaration": {"type": "boolean"},
        "lib": {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
        "paths": {"type": "object", "additionalProperties": {"type": "array", "uniqueItems": False, "items": {"type": "string"}}},
        "noEmit": {"type": "boolean"}, "sourceMap": {"type": "boolean"}, "jsx": {"enum": ["preserve", "react", "react-jsx", "react-native"]},
        "maxNodeModuleJsDepth": {"type": "number", "default": 0}}}}},
    "filesDefinition": {"properties": {"files": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}}},
    "excludeDefinition": {"properties": {"exclude": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}}},
    "extendsDefinition": {"properties": {"extends": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}}}},
  "type": "object",
  "allOf": [{"$ref": "#/definitions/compilerOptionsDefinition"}, {"$ref": "#/definitions/filesDefinition"}, {"$ref": "#/definitions/excludeDefinition"}, {"$ref": "#/definitions/extendsDefinition"},
            {"anyOf": [{"$ref": "#/definitions/filesDefinition"}, {"required": ["include"]}, {"required": ["extends"]}, {"type": "object"}]}]}
ts_ok = {"extends": "./base.json", "compilerOptions": {"strict": True, "target": "ES2020", "module": "commonjs", "outDir": "dist", "lib": ["dom", "es2020"],
   "paths": {"@/*": ["src/*"]}, "jsx": "react-jsx", "sourceMap": True, "declaration": False}, "exclude": ["node_modules"], "include": ["src"]}
add("03-tsconfig", ts, [ts_ok, {}, {"compilerOptions": {}}],
    [mut(ts_ok, lambda o: o["compilerOptions"].__setitem__("target", "ES2099")),
     mut(ts_ok, lambda o: o["compilerOptions"].__setitem__("lib", ["dom", "dom"])),
     mut(ts_ok, lambda o: o["compilerOptions"].__setitem__("strict", "yes")),
     mut(ts_ok, lambda o: o.__setitem__("extends", 3))])

# 4. OpenAPI components (nullable, discriminator, readOnly, example, int64 format)
oapi = {"components": {"schemas": {
   "Pet": {"type": "object", "required": ["id", "name", "petType"], "discriminator": {"propertyName": "petType"},
     "properties": {"id": {"type": "integer", "format": "int64", "readOnly": True, "example": 10},
       "name": {"type": "string", "example": "doggie", "minLength": 1, "maxLength": 64},
       "petType": {"type": "string", "enum": ["cat", "dog"]}, "tag": {"type": "string", "nullable": True},
       "status": {"type": "string", "description": "pet status in the store", "enum": ["available", "pending", "sold"]},
       "weight": {"type": "number", "minimum": 0.1, "maximum": 1e3, "exclusiveMinimum": False},
       "photoUrls": {"type": "array", "xml": {"wrapped": True}, "items": {"type": "string", "xml": {"name": "photoUrl"}}}},
     "xml": {"name": "pet"}},
   "Error": {"type": "object", "required": ["code", "message"], "properties": {"code": {"type": "integer", "format": "int32"}, "message": {"type": "string"}}}}},
  "type": "object", "properties": {"pets": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}, "maxItems": 100},
      "error": {"$ref": "#/components/schemas/Error"}, "next": {"type": "string", "format": "uri"}}, "additionalProperties": False}
pet = {"name": "Rex", "id": 12345678901234, "petType": "dog", "status": "available", "weight": 12.5, "photoUrls": ["https://example.com/a.png"], "tag": "good"}
add("04-openapi-components", oapi, [{"pets": [pet, {"id": 1, "name": "Tom", "petType": "cat"}]}, {"error": {"message": "not found", "code": 404}}, {}],
   [{"pets": [mut(pet, lambda o: o.__setitem__("petType", "bird"))]}, {"pets": [mut(pet, lambda o: o.__setitem__("weight", 0.05))]},
    {"pets": [mut(pet, lambda o: o.pop("name"))]}, {"error": {"code": "404", "message": "x"}}, {"other": 1},
    {"pets": [mut(pet, lambda o: o.__setitem__("id", 1.5))]}, {"pets": [mut(pet, lambda o: o.__setitem__("tag", None))]}])

# 5. Function-calling tool schemas
tools = {"type": "object", "properties": {
   "tool_calls": {"type": "array", "minItems": 1, "items": {"oneOf": [
      {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {
          "location": {"type": "string", "description": "City and state, e.g. San Francisco, CA"},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
          "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["location"], "additionalProperties": False}},
       "required": ["name", "arguments"], "additionalProperties": False},
      {"type": "object", "properties": {"name": {"const": "search"}, "arguments": {"type": "object", "properties": {
          "query": {"type": "string", "minLength": 1}, "max_results": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
          "filters": {"type": "object", "properties": {"site": {"type": "string"}, "after": {"type": "string", "format": "date"}}, "additionalProperties": False}},
          "required": ["query"], "additionalProperties": False}}, "required": ["name", "arguments"], "additionalProperties": False}]}}},
  "required": ["tool_calls"], "additionalProperties": False, "strict": True}
add("05-function-calling", tools,
   [{"tool_calls": [{"name": "get_weather", "arguments": {"unit": "celsius", "location": "Paris"}}, {"arguments": {"query": "rust", "filters": {"after": "2024-01-31"}}, "name": "search"}]}],
   [{"tool_calls": []}, {"tool_calls": [{"name": "get_weather", "arguments": {"unit": "kelvin", "location": "Paris"}}]},
    {"tool_calls": [{"name": "search", "arguments": {"query": ""}}]}, {"tool_calls": [{"name": "search", "arguments": {"query": "x", "filters": {"after": "2024-02-30"}}}]},
    {"tool_calls": [{"name": "get_weather", "arguments": {"location": "x", "days": 15}}]},
    {"tool_calls": [{"name": "delete_all", "arguments": {}}]}])

# 6. GitHub workflow-like: patternProperties for jobs, oneOf on `on`
wf = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["on", "jobs"], "additionalProperties": False,
  "definitions": {"step": {"type": "object", "properties": {"name": {"type": "string"}, "uses": {"type": "string"}, "run": {"type": "string"},
        "with": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}, "env": {"type": "object"}},
        "dependencies": {"with": ["uses"]}, "oneOf": [{"required": ["uses"]}, {"required": ["run"]}], "additionalProperties": False}},
  "properties": {"name": {"type": "string"},
    "on": {"oneOf": [{"type": "string", "enum": ["push", "pull_request", "workflow_dispatch"]}, {"type": "array", "items": {"type": "string"}, "minItems": 1}, {"type": "object", "minProperties": 1}]},
    "jobs": {"type": "object", "patternProperties": {"^[_a-zA-Z][a-zA-Z0-9_-]*$": {"type": "object", "required": ["runs-on", "steps"], "properties": {
        "runs-on": {"type": ["string", "array"]}, "needs": {"type": ["string", "array"]}, "timeout-minutes": {"type": "number", "exclusiveMinimum": 0},
        "steps": {"type": "array", "items": {"$ref": "#/definitions/step"}, "minItems": 1}}}}, "additionalProperties": False, "minProperties": 1}}}
wf_ok = {"name": "CI", "on": ["push", "pull_request"], "jobs": {"build": {"runs-on": "ubuntu-latest", "timeout-minutes": 10.5,
   "steps": [{"uses": "actions/checkout@v4"}, {"name": "Test", "run": "cargo test"}, {"uses": "actions/setup-node@v4", "with": {"node-version": 20}}]}}}
add("06-github-workflow", wf, [wf_ok, {"on": "push", "jobs": {"a": {"runs-on": ["self-hosted"], "steps": [{"run": "make"}]}}}],
   [mut(wf_ok, lambda o: o["jobs"].__setitem__("1bad", {"runs-on": "x", "steps": [{"run": "y"}]})),
    mut(wf_ok, lambda o: o["jobs"]["build"]["steps"].append({"uses": "a", "run": "b"})),
    mut(wf_ok, lambda o: o["jobs"]["build"]["steps"].append({"run": "b", "with": {"x": 1}})),
    mut(wf_ok, lambda o: o.__setitem__("jobs", {})), mut(wf_ok, lambda o: o.__setitem__("on", [])),
    mut(wf_ok, lambda o: o["jobs"]["build"].__setitem__("timeout-minutes", 0))])

# 7. docker-compose-like
dc = {"type": "object", "properties": {"version": {"type": "string"}, "services": {"type": "object", "patternProperties": {"^[a-zA-Z0-9._-]+$": {"$ref": "#/definitions/service"}}, "additionalProperties": False}},
  "required": ["services"], "additionalProperties": False,
  "definitions": {"service": {"type": "object", "properties": {"image": {"type": "string"}, "build": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"context": {"type": "string"}, "dockerfile": {"type": "string"}}}]},
     "ports": {"type": "array", "uniqueItems": True, "items": {"type": ["string", "number"], "format": "ports"}},
     "environment": {"oneOf": [{"type": "object", "patternProperties": {".+": {"type": ["string", "number", "boolean", "null"]}}, "additionalProperties": False}, {"type": "array", "items": {"type": "string"}, "uniqueItems": True}]},
     "depends_on": {"type": "array", "items": {"type": "string"}}, "restart": {"type": "string"}, "deploy": {"type": ["object", "null"]}},
     "additionalProperties": False, "patternProperties": {"^x-": {}}}}}
dc_ok = {"services": {"web": {"build": ".", "ports": ["8080:80", 443], "environment": {"DEBUG": True, "PORT": 8080, "NAME": None}, "depends_on": ["db"], "x-custom": {"a": 1}},
                       "db": {"image": "postgres:16", "environment": ["POSTGRES_PASSWORD=x"], "restart": "always"}}, "version": "3.9"}
add("07-docker-compose", dc, [dc_ok], [mut(dc_ok, lambda o: o["services"]["web"].__setitem__("ports", [80, 80])),
    mut(dc_ok, lambda o: o["services"]["db"].__setitem__("environment", ["A=1", "A=1"])),
    mut(dc_ok, lambda o: o["services"]["db"].__setitem__("volumes", [])), mut(dc_ok, lambda o: o["services"].__setitem__("bad name", {})),
    mut(dc_ok, lambda o: o["services"]["web"]["environment"].__setitem__("X", [1]))])

# 8. GeoJSON Feature (discriminated oneOf by const type)
geo = {"title": "GeoJSON Feature", "type": "object", "required": ["type", "geometry", "properties"],
  "properties": {"type": {"type": "string", "enum": ["Feature"]}, "id": {"oneOf": [{"type": "number"}, {"type": "string"}]},
   "properties": {"oneOf": [{"type": "null"}, {"type": "object"}]},
   "geometry": {"oneOf": [{"type": "null"},
      {"type": "object", "required": ["type", "coordinates"], "properties": {"type": {"type": "string", "enum": ["Point"]}, "coordinates": {"type": "array", "minItems": 2, "items": {"type": "number"}}}},
      {"type": "object", "required": ["type", "coordinates"], "properties": {"type": {"type": "string", "enum": ["LineString"]}, "coordinates": {"type": "array", "minItems": 2, "items": {"type": "array", "minItems": 2, "items": {"type": "number"}}}}},
      {"type": "object", "required": ["type", "coordinates"], "properties": {"type": {"type": "string", "enum": ["Polygon"]}, "coordinates": {"type": "array", "items": {"type": "array", "minItems": 4, "items": {"type": "array", "minItems": 2, "items": {"type": "number"}}}}}}]},
   "bbox": {"type": "array", "minItems": 4, "items": {"type": "number"}}}}
add("08-geojson-feature", geo, [{"type": "Feature", "geometry": {"type": "Point", "coordinates": [102.0, 0.5]}, "properties": {"prop0": "value0"}, "id": 7},
    {"properties": None, "geometry": {"coordinates": [[102.0, 0.0], [103.0, 1.0], [104.0, 0.0]], "type": "LineString"}, "type": "Feature"},
    {"type": "Feature", "geometry": None, "properties": None, "bbox": [-10.5, -10, 10, 10.25]}],
   [{"type": "Feature", "geometry": {"type": "Point", "coordinates": [102.0]}, "properties": None},
    {"type": "Feature", "geometry": {"type": "Circle", "coordinates": [1, 2]}, "properties": None},
    {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}}, {"type": "Feature", "geometry": None, "properties": 5}])

# 9. JSON-RPC 2.0 request
rpc = {"$schema": "http://json-schema.org/draft-04/schema#", "description": "A JSON RPC 2.0 request", "type": "object", "required": ["jsonrpc", "method"],
   "properties": {"jsonrpc": {"enum": ["2.0"]}, "method": {"type": "string"}, "id": {"type": ["string", "number", "null"], "note": ["While allowed, null should be avoided"]},
   "params": {"type": ["array", "object"]}}, "additionalProperties": False}
add("09-json-rpc", rpc, [{"jsonrpc": "2.0", "method": "sum", "params": [1, 2, 4], "id": "1"}, {"method": "notify", "jsonrpc": "2.0", "params": {"a": 1}}, {"jsonrpc": "2.0", "method": "x", "id": None}],
   [{"jsonrpc": "1.0", "method": "x"}, {"jsonrpc": "2.0", "method": "x", "params": "bad"}, {"jsonrpc": "2.0"}, {"jsonrpc": "2.0", "method": "x", "result": 1}])

# 10. eslintrc-like: rule levels oneOf, additionalProperties schemas
esl = {"definitions": {"rule": {"oneOf": [{"enum": [0, 1, 2]}, {"enum": ["off", "warn", "error"]}, {"type": "array", "minItems": 1}]}},
   "type": "object", "properties": {"root": {"type": "boolean"}, "extends": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
   "rules": {"type": "object", "properties": {"no-unused-vars": {"$ref": "#/definitions/rule"}, "quotes": {"$ref": "#/definitions/rule"}}, "additionalProperties": {"$ref": "#/definitions/rule"}},
   "env": {"type": "object", "additionalProperties": {"type": "boolean"}}, "parserOptions": {"type": "object", "properties": {"ecmaVersion": {"anyOf": [{"enum": [3, 5, 6, 2015, 2020, 2022, "latest"]}, {"type": "integer", "minimum": 2015}]}, "sourceType": {"enum": ["script", "module"]}}}}}
add("10-eslintrc", esl, [{"root": True, "extends": ["eslint:recommended"], "env": {"browser": True}, "rules": {"quotes": ["error", "double"], "semi": 2, "no-console": "warn"}, "parserOptions": {"ecmaVersion": "latest", "sourceType": "module"}},
                         {"parserOptions": {"ecmaVersion": 2031}}],
   [{"rules": {"semi": 3}}, {"rules": {"quotes": []}}, {"env": {"node": "yes"}}, {"parserOptions": {"ecmaVersion": 4}}])

# 11. if/then/else: address with country-specific postal codes
addr = {"type": "object", "properties": {"street_address": {"type": "string"}, "country": {"default": "United States of America", "enum": ["United States of America", "Canada", "Netherlands"]}, "postal_code": {"type": "string"}},
  "allOf": [{"if": {"properties": {"country": {"const": "United States of America"}}}, "then": {"properties": {"postal_code": {"pattern": "^[0-9]{5}(-[0-9]{4})?$"}}}},
            {"if": {"properties": {"country": {"const": "Canada"}}, "required": ["country"]}, "then": {"properties": {"postal_code": {"pattern": "^[A-Z][0-9][A-Z] [0-9][A-Z][0-9]$"}}}}]}
add("11-if-then-else-address", addr, [{"street_address": "1600 Pennsylvania Avenue NW", "country": "United States of America", "postal_code": "20500"}, {"country": "Canada", "postal_code": "K1M 1M4"}, {"country": "Netherlands", "postal_code": "1234 AB"}],
   [{"country": "United States of America", "postal_code": "K1M 1M4"}, {"country": "Canada", "postal_code": "10000"}, {"postal_code": "1234 AB"}])

# 12. dependentRequired / dependencies, minProperties, propertyNames
pay = {"type": "object", "properties": {"name": {"type": "string"}, "credit_card": {"type": "number"}, "billing_address": {"type": "string"}},
  "required": ["name"], "dependentRequired": {"credit_card": ["billing_address"]}, "dependencies": {"billing_address": ["credit_card"]},
  "propertyNames": {"pattern": "^[a-z_]+$"}, "minProperties": 1, "maxProperties": 4}
add("12-dependent-required", pay, [{"name": "John Doe", "credit_card": 5555555555555555, "billing_address": "555 Debtor's Lane"}, {"name": "John Doe"}],
   [{"name": "John Doe", "credit_card": 5555555555555555}, {"name": "John Doe", "billing_address": "x"}, {"name": "x", "Extra": 1}])

# 13. store item: multipleOf price, uniqueItems tags, exclusiveMinimum, maxLength big, pattern+maxLength
item = {"type": "object", "required": ["sku", "price"], "properties": {
    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$", "maxLength": 8},
    "price": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.01},
    "quantity": {"type": "integer", "minimum": 0, "maximum": 1e6, "multipleOf": 5},
    "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 20}, "uniqueItems": True, "maxItems": 10},
    "description": {"type": "string", "maxLength": 50000}, "rating": {"type": "number", "minimum": 0.5, "maximum": 5}, "serial": {"type": "integer", "minimum": 0, "maximum": 18446744073709551615}}}
add("13-store-item", item, [{"sku": "ABC-1234", "price": 19.99, "quantity": 25, "tags": ["new", "sale"], "rating": 4.5, "description": "x" * 300, "serial": 12345678901234567}],
   [{"sku": "ABC-12345", "price": 1}, {"sku": "ABC-1234", "price": 0}, {"sku": "ABC-1234", "price": 1, "quantity": 7}, {"sku": "ABC-1234", "price": 1, "tags": ["a", "a"]},
    {"sku": "ABC-1234", "price": 1, "rating": 0.4}, {"sku": "ABC-1234", "price": 1.005}])

# 14. recursive menu with allOf + $ref (the issue-17 shape, optional children)
menu = {"definitions": {"base": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
   "item": {"allOf": [{"$ref": "#/definitions/base"}, {"properties": {"children": {"type": "array", "items": {"allOf": [{"$ref": "#/definitions/item"}, {"$ref": "#/definitions/base"}]}}, "href": {"type": "string", "format": "uri"}}}]}},
  "type": "object", "properties": {"menu": {"type": "array", "items": {"$ref": "#/definitions/item"}}}, "required": ["menu"]}
add("14-recursive-menu", menu, [{"menu": [{"label": "File", "children": [{"label": "Open", "href": "https://example.com/open"}, {"label": "Recent", "children": [{"label": "a.txt"}]}]}]}],
   [{"menu": [{"label": "File", "children": [{"href": "https://example.com"}]}]}, {"menu": [{"children": []}]}, {"menu": [{"label": "x", "children": [{"label": "y", "children": [{"label": 3}]}]}]}])

# 15. not + contains + mixed-type enum
acl = {"type": "object", "properties": {"roles": {"type": "array", "items": {"type": "string"}, "contains": {"const": "admin"}},
   "level": {"enum": [1, "one", None, True, 2.5]}, "user": {"type": "object", "not": {"required": ["password"]}}}, "required": ["roles"]}
add("15-not-contains-enum", acl, [{"roles": ["user", "admin"], "level": "one", "user": {"name": "x"}}, {"roles": ["admin"], "level": None}, {"roles": ["admin"], "level": 2.5}],
   [{"roles": ["user"]}, {"roles": ["admin"], "level": 2}, {"roles": ["admin"], "user": {"password": "x"}}])

# 16. draft-04 exclusiveMinimum booleans, additionalItems, tuple items
d4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "properties": {
   "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
   "point": {"type": "array", "items": [{"type": "number"}, {"type": "number"}], "additionalItems": False},
   "row": {"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "integer"}}}}
add("16-draft04-tuples", d4, [{"ratio": 0.25, "point": [1, 2.5], "row": ["a", 1, 2, 3]}, {"ratio": 1, "row": ["a"]}],
   [{"ratio": 0}, {"point": [1, 2, 3]}, {"row": ["a", "b"]}, {"ratio": 1.5}])

# 17. big object (> tracked properties): any order, required tracked
big = {"type": "object", "properties": {k: {"type": "string"} for k in ["id", "first_name", "last_name", "email", "phone", "company", "title", "city", "country", "zip"]},
   "required": ["id", "email"], "additionalProperties": False}
big_ok = {"zip": "12345", "email": "a@b.c", "city": "Paris", "id": "u1", "first_name": "Ann", "last_name": "Lee", "title": "Dr", "company": "X", "country": "FR", "phone": "+33"}
add("17-wide-object-any-order", big, [big_ok, {"email": "x", "id": "y"}],
   [{"email": "x"}, mut(big_ok, lambda o: o.__setitem__("extra", "x")), mut(big_ok, lambda o: o.__setitem__("zip", 12345))],
   valid_texts=['{"email":"x","id":"y","city":"a","zip":"1"}', '{"id":"y","email":"x"}'])

# 18. spelling: escapes, surrogates, exponents, long numbers, deep pretty indentation
sp = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 5}, "n": {"type": "number"}, "i": {"type": "integer"}, "nested": {"type": "array", "items": {"type": "array", "items": {"type": "array"}}}}}
add("18-json-spelling", sp, [{"text": "héllo", "n": 1e300, "i": 123456789012345678, "nested": [[[1]]]}], [{"text": "toolong"}, {"i": 1.5}],
   valid_texts=['{"text":"\\ud83d\\ude00\\u00e9","n":-1.5E-10,"i":-0}', '{\r\n\t"n" : 0.30000000000000004 ,\n  "i":1.0}', '{"text":"\\"\\\\\\/\\b"}'])

# 19. OpenAI structured output strict (nullable via type arrays, $defs recursion)
oa = {"type": "object", "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}}, "final_answer": {"type": "string"}},
  "required": ["steps", "final_answer"], "additionalProperties": False,
  "$defs": {"step": {"type": "object", "properties": {"explanation": {"type": "string"}, "output": {"type": ["string", "null"]}, "substeps": {"type": ["array", "null"], "items": {"$ref": "#/$defs/step"}}},
      "required": ["explanation", "output", "substeps"], "additionalProperties": False}}}
add("19-structured-output-strict", oa, [{"steps": [{"explanation": "a", "output": None, "substeps": [{"substeps": None, "explanation": "b", "output": "x"}]}], "final_answer": "42"}],
   [{"steps": [{"explanation": "a", "output": None}], "final_answer": "x"}, {"steps": [], "final_answer": "x", "extra": 1}, {"steps": []}])

# 20. anyOf with siblings + allOf type narrowing + const discriminators (CloudEvents-like)
ce = {"type": "object", "required": ["specversion", "id", "source", "type"], "properties": {
   "specversion": {"type": "string", "const": "1.0"}, "id": {"type": "string", "minLength": 1}, "source": {"type": "string", "format": "uri-reference", "minLength": 1},
   "type": {"type": "string", "minLength": 1}, "datacontenttype": {"type": ["string", "null"]}, "time": {"type": ["string", "null"], "format": "date-time"},
   "data": {"type": ["object", "string", "number", "array", "boolean", "null"]}},
   "patternProperties": {"^[a-z0-9]{1,20}$": {"type": ["string", "integer", "boolean", "null"]}}, "additionalProperties": False}
add("20-cloudevents", ce, [{"specversion": "1.0", "id": "A234-1234-1234", "source": "/mycontext", "type": "com.example.someevent", "time": "2018-04-05T17:31:00Z", "data": "hello", "comexampleextension1": "value"}],
   [{"specversion": "0.3", "id": "a", "source": "/x", "type": "t"}, {"specversion": "1.0", "id": "", "source": "/x", "type": "t"}, {"specversion": "1.0", "id": "a", "source": "/x", "type": "t", "Bad-Ext": 1},
    {"specversion": "1.0", "id": "a", "source": "/x", "type": "t", "time": "yesterday"}])

for name, v in C.items():
    with open(name + ".json", "w") as f:
        json.dump(v, f, indent=1, ensure_ascii=False)
        f.write("\n")
print(len(C))

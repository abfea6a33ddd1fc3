#!/usr/bin/env python3
"""Checks of the deployment files that can run without Docker, Helm or a cluster (run by scripts/check-deploy).

1. docker-compose.yml parses; every depends_on names a service; every bind-mounted file exists; every service
   has an image or a build whose context and Dockerfile exist; every network/volume used is declared.
2. deploy/kubernetes/*.yaml pass kubernetes-validate (strict); the CRDs in deploy/kubernetes/optional/ (KEDA
   ScaledObject, ServiceMonitor) are checked structurally here, since kubernetes-validate has no schema for them.
3. helm/hookline/values.yaml validates against values.schema.json.
4. deploy/prometheus/alerts.yml and deploy/grafana/hookline.json parse, their PromQL parses, and every hookline_*
   metric they name is in docs/metrics.md.
5. Every metric emitted in crates/*/src (counter!/gauge!/histogram!) is in docs/metrics.md, and vice versa.

Exits non-zero naming each failing item.
"""
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S_VERSION = "1.30.0"
failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL {msg}")


def ok(msg):
    print(f"ok   {msg}")


def rel(p):
    return os.path.relpath(p, ROOT)


def need(module, package):
    try:
        return __import__(module)
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", package])
        return __import__(module)


yaml = need("yaml", "pyyaml")
jsonschema = need("jsonschema", "jsonschema")
need("kubernetes_validate", "kubernetes-validate")
promql = need("promql_parser", "promql-parser")


# --- 5. the metrics catalogue ----------------------------------------------------------------------------------
def catalogue():
    names = set()
    for line in open(os.path.join(ROOT, "docs", "metrics.md"), encoding="utf-8"):
        m = re.match(r"^\|\s*`(hookline_[a-z0-9_]+)`\s*\|", line)
        if m:
            names.add(m.group(1))
    return names


def emitted():
    found = {}
    pattern = re.compile(r'\b(?:counter|gauge|histogram)!\(\s*"([^"]+)"')
    for path in glob.glob(os.path.join(ROOT, "crates", "*", "src", "**", "*.rs"), recursive=True):
        text = open(path, encoding="utf-8").read()
        for m in pattern.finditer(text):
            found.setdefault(m.group(1), rel(path))
    return found


CATALOGUE = catalogue()


def check_catalogue():
    code = emitted()
    if not code:
        fail("metrics: found no counter!/gauge!/histogram! in crates/*/src (scan broken?)")
    for name, where in sorted(code.items()):
        if name not in CATALOGUE:
            fail(f"metrics: {name} is emitted in {where} but not listed in docs/metrics.md")
    for name in sorted(CATALOGUE - set(code)):
        fail(f"metrics: {name} is listed in docs/metrics.md but emitted nowhere in crates/*/src")
    ok(f"metrics catalogue: {len(code)} emitted, {len(CATALOGUE)} listed")


# --- 4. alerts and dashboard -------------------------------------------------------------------------------------
def metric_known(name):
    if name in CATALOGUE:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in CATALOGUE:
            return True
    return False


def check_expr(where, expr):
    try:
        promql.parse(expr.replace("$__rate_interval", "5m").replace("$__interval", "1m"))
    except Exception as e:  # noqa: BLE001 - the parser raises plain exceptions
        fail(f"{where}: PromQL does not parse ({e}): {expr.strip()}")
    for name in set(re.findall(r"\bhookline_[a-z0-9_]+", expr)):
        if not metric_known(name):
            fail(f"{where}: metric {name} is not in docs/metrics.md")


def check_alerts():
    path = os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")
    doc = yaml.safe_load(open(path))
    n = 0
    for g in doc.get("groups") or []:
        for r in g.get("rules") or []:
            name = r.get("alert") or r.get("record")
            if not name or "expr" not in r:
                fail(f"{rel(path)}: rule in group {g.get('name')} lacks alert/record or expr")
                continue
            check_expr(f"{rel(path)} {name}", str(r["expr"]))
            n += 1
    if n == 0:
        fail(f"{rel(path)}: no rules")
    ok(f"{rel(path)}: {n} rules")


def check_dashboard():
    path = os.path.join(ROOT, "deploy", "grafana", "hookline.json")
    dash = json.load(open(path))
    n = 0
    ids = set()
    for p in dash.get("panels", []):
        if p.get("id") in ids:
            fail(f"{rel(path)}: duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        for t in p.get("targets", []):
            check_expr(f"{rel(path)} panel '{p.get('title')}'", t["expr"])
            n += 1
    ok(f"{rel(path)}: {len(dash.get('panels', []))} panels, {n} queries")
    prom = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
    yaml.safe_load(open(prom))
    ok(f"{rel(prom)}: parses")


# --- 1. docker compose -------------------------------------------------------------------------------------------
def check_compose():
    path = os.path.join(ROOT, "docker-compose.yml")
    doc = yaml.safe_load(open(path))
    services = doc.get("services") or {}
    if not services:
        fail("docker-compose.yml: no services")
    nets = set((doc.get("networks") or {}).keys()) | {"default"}
    vols = set((doc.get("volumes") or {}).keys())
    for name, s in services.items():
        where = f"docker-compose.yml service {name}"
        if not isinstance(s, dict):
            fail(f"{where}: not a mapping")
            continue
        if "image" not in s and "build" not in s:
            fail(f"{where}: neither image nor build")
        if "image" in s and not re.match(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?$", str(s["image"])):
            fail(f"{where}: image reference {s['image']!r} looks wrong")
        if "image" in s and "build" not in s and ":" not in str(s["image"]).split("/")[-1]:
            fail(f"{where}: image {s['image']} has no tag")
        if "build" in s:
            b = s["build"]
            ctx = b if isinstance(b, str) else b.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(b, str) else b.get("dockerfile", "Dockerfile")
            if not os.path.isdir(os.path.join(ROOT, ctx)):
                fail(f"{where}: build context {ctx} does not exist")
            elif not os.path.isfile(os.path.join(ROOT, ctx, dockerfile)):
                fail(f"{where}: {dockerfile} does not exist in {ctx}")
        deps = s.get("depends_on") or []
        for d in deps if isinstance(deps, list) else deps.keys():
            if d not in services:
                fail(f"{where}: depends_on names {d}, which is not a service")
            if d == name:
                fail(f"{where}: depends on itself")
        for v in s.get("volumes") or []:
            src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if src.startswith((".", "/")):
                if not os.path.exists(os.path.join(ROOT, src)):
                    fail(f"{where}: bind-mounted {src} does not exist")
            elif src and src not in vols:
                fail(f"{where}: volume {src} is not declared under volumes:")
        sn = s.get("networks") or []
        for n in sn if isinstance(sn, list) else sn.keys():
            if n not in nets:
                fail(f"{where}: network {n} is not declared")
        for p in s.get("ports") or []:
            if not re.match(r"^(\d+:)?\d+(/tcp|/udp)?$", str(p)):
                fail(f"{where}: port {p!r} is not HOST:CONTAINER")
        cmd = s.get("command")
        if isinstance(cmd, list) and cmd and cmd[0].startswith("hookline") and cmd[0] not in BINARIES:
            fail(f"{where}: command {cmd[0]} is not one of the image's binaries {sorted(BINARIES)}")
    # Prometheus must scrape every hookline service, at the port the binary listens on.
    prom = yaml.safe_load(open(os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")))
    targets = {t for sc in prom["scrape_configs"] for st in sc.get("static_configs", []) for t in st["targets"]}
    port_of = {"hookline-ingest": 8080, "hookline-dispatcher": 9091, "hookline-retry-scheduler": 9092}
    for name, s in services.items():
        cmd = s.get("command") or []
        if cmd and cmd[0] in port_of and f"{name}:{port_of[cmd[0]]}" not in targets:
            fail(f"deploy/prometheus/prometheus.yml: does not scrape {name}:{port_of[cmd[0]]}")
    for t in targets:
        host = t.split(":")[0]
        if host != "localhost" and host not in services:
            fail(f"deploy/prometheus/prometheus.yml: target {t} is not a compose service")
    ok(f"docker-compose.yml: {len(services)} services")


def binaries():
    names = set()
    for toml_path in glob.glob(os.path.join(ROOT, "crates", "*", "Cargo.toml")):
        text = open(toml_path).read()
        names |= set(re.findall(r'\[\[bin\]\]\s*name\s*=\s*"([^"]+)"', text))
    return names


BINARIES = binaries()


def check_dockerfile():
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    for b in BINARIES:
        if f"target/release/{b} " not in text and f"target/release/{b}\n" not in text:
            fail(f"Dockerfile: binary {b} is not copied out of the build stage")
    if not re.search(r"^USER\s+\d+", text, re.M):
        fail("Dockerfile: no numeric non-root USER")
    ok(f"Dockerfile: copies {sorted(BINARIES)}, non-root")


# --- 2. Kubernetes manifests -------------------------------------------------------------------------------------
def check_kubernetes():
    files = sorted(glob.glob(os.path.join(ROOT, "deploy", "kubernetes", "*.yaml")))
    if not files:
        fail("deploy/kubernetes: no manifests")
        return
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "-k", K8S_VERSION, "--strict", "--quiet", *files],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"kubernetes-validate -k {K8S_VERSION}:\n{r.stdout}{r.stderr}")
    else:
        ok(f"kubernetes-validate -k {K8S_VERSION} --strict: {', '.join(rel(f) for f in files)}")
    # Deployments reference only ConfigMaps/Secrets that exist among the manifests.
    docs = [d for f in files for d in yaml.safe_load_all(open(f)) if d]
    have = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for d in docs:
        if d["kind"] not in ("Deployment", "Job"):
            continue
        pod = d["spec"]["template"]["spec"]
        for v in pod.get("volumes", []):
            if "configMap" in v and ("ConfigMap", v["configMap"]["name"]) not in have:
                fail(f"deploy/kubernetes {d['kind']} {d['metadata']['name']}: ConfigMap {v['configMap']['name']} missing")
        for c in pod["containers"]:
            if c.get("command", [""])[0] not in BINARIES:
                fail(f"deploy/kubernetes {d['metadata']['name']}: command {c.get('command')} is not a hookline binary")
            for e in c.get("env", []):
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref and ("Secret", ref["name"]) not in have:
                    fail(f"deploy/kubernetes {d['metadata']['name']}: Secret {ref['name']} missing")
    # CRDs: structural checks only.
    for f in sorted(glob.glob(os.path.join(ROOT, "deploy", "kubernetes", "optional", "*.yaml"))):
        for d in yaml.safe_load_all(open(f)):
            if not d:
                continue
            where = f"{rel(f)} {d.get('kind')}"
            if d.get("kind") == "ScaledObject":
                spec = d["spec"]
                if d.get("apiVersion") != "keda.sh/v1alpha1":
                    fail(f"{where}: apiVersion must be keda.sh/v1alpha1")
                if ("Deployment", spec["scaleTargetRef"]["name"]) not in have:
                    fail(f"{where}: scaleTargetRef {spec['scaleTargetRef']['name']} is not a Deployment here")
                for t in spec["triggers"]:
                    md = t["metadata"]
                    missing = {"bootstrapServers", "consumerGroup", "topic", "lagThreshold"} - set(md)
                    if t["type"] != "kafka" or missing:
                        fail(f"{where}: kafka trigger lacks {sorted(missing)}")
                    if not all(isinstance(v, str) for v in md.values()):
                        fail(f"{where}: trigger metadata values must be strings")
                    if not md.get("topic", "").endswith("deliveries"):
                        fail(f"{where}: must scale on the deliveries topic")
                if not 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]:
                    fail(f"{where}: replica bounds")
            elif d.get("kind") == "ServiceMonitor":
                if d.get("apiVersion") != "monitoring.coreos.com/v1":
                    fail(f"{where}: apiVersion must be monitoring.coreos.com/v1")
                ports = {p["name"] for x in docs if x["kind"] == "Service" for p in x["spec"]["ports"]}
                for ep in d["spec"]["endpoints"]:
                    if ep["port"] not in ports:
                        fail(f"{where}: endpoint port {ep['port']} is on no Service")
                sel = d["spec"]["selector"]["matchLabels"]
                if not any(x["kind"] == "Service" and sel.items() <= x["metadata"]["labels"].items() for x in docs):
                    fail(f"{where}: selector matches no Service")
            else:
                fail(f"{where}: unexpected kind in optional/")
        ok(f"{rel(f)}: structural check (kubernetes-validate has no schema for this CRD)")


# --- 3. Helm values ----------------------------------------------------------------------------------------------
def check_helm():
    chart = os.path.join(ROOT, "helm", "hookline")
    schema = json.load(open(os.path.join(chart, "values.schema.json")))
    jsonschema.Draft202012Validator.check_schema(schema)
    values = yaml.safe_load(open(os.path.join(chart, "values.yaml")))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(values), key=lambda e: list(e.path))
    for e in errors:
        fail(f"helm/hookline/values.yaml {'.'.join(map(str, e.path)) or '(root)'}: {e.message}")
    # The schema must reject what it is there to reject.
    bad = json.loads(json.dumps(values))
    bad["kafka"]["properties"] = {"acks": "1"}
    if jsonschema.Draft202012Validator(schema).is_valid(bad):
        fail("helm/hookline/values.schema.json accepts a protected kafka property")
    meta = yaml.safe_load(open(os.path.join(chart, "Chart.yaml")))
    if meta.get("apiVersion") != "v2" or not meta.get("version"):
        fail("helm/hookline/Chart.yaml: needs apiVersion v2 and a version")
    if not errors:
        ok("helm/hookline/values.yaml validates against values.schema.json")


def main():
    for check in (check_compose, check_dockerfile, check_kubernetes, check_helm, check_alerts, check_dashboard, check_catalogue):
        try:
            check()
        except Exception as e:  # noqa: BLE001 - report the item and keep checking the rest
            fail(f"{check.__name__}: {type(e).__name__}: {e}")
    if failures:
        print(f"\ncheck-deploy: {len(failures)} failure(s)")
        return 1
    print("\ncheck-deploy: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

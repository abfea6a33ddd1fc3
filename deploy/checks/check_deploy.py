#!/usr/bin/env python3
"""Checks of the deployment files that can run without Docker or a cluster (run by scripts/check-deploy).

1. docker-compose.yml parses; every depends_on names a service; every bind-mounted file exists; every service
   has an image or a build whose context and Dockerfile exist; every network/volume used is declared.
2. deploy/kubernetes/*.yaml pass kubernetes-validate (strict); the CRDs in deploy/kubernetes/optional/ (KEDA
   ScaledObject, ServiceMonitor) are checked structurally here, and in 3 against the chart's rendering.
3. helm/hookline/values.yaml validates against values.schema.json; the chart passes helm lint and renders with each
   value set in helm/hookline/ci, every object validating against the Kubernetes schemas (kubernetes-validate, strict)
   or its CRD's schema (KEDA, Prometheus Operator, Strimzi: chart_tools.py), with its references checked and, when a
   hookline binary is built, each container's config loaded by hookline itself; deploy/checks/chart-must-fail/*.yaml
   must be refused.
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
import tempfile

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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chart_tools  # noqa: E402 - after the pip installs it relies on


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


# --- 3b. The chart, rendered --------------------------------------------------------------------------------------
CHART = os.path.join(ROOT, "helm", "hookline")
RELEASE = "hookline"
# Value sets that the chart must refuse (helm template fails): file -> a phrase of the expected error.
MUST_FAIL = os.path.join(ROOT, "deploy", "checks", "chart-must-fail")


def helm_args(values_file):
    """Extra helm template arguments a value set asks for in a `# helm-args: ...` line (e.g. --api-versions)."""
    args = []
    for line in open(values_file):
        m = re.match(r"^#\s*helm-args:\s*(.+)$", line)
        if m:
            args += m.group(1).split()
    return args


def code_topics():
    """{base name: (cleanup, co-partitioned, retention days, min compaction lag days)} from Topics in
    crates/kafka/src/topics.rs."""
    text = open(os.path.join(ROOT, "crates", "kafka", "src", "topics.rs")).read()
    names = dict(re.findall(r"(\w+): name\(\"([^\"]+)\"\)", text))
    tiers = re.findall(r'Tier \{ name: "([^"]+)", delay_ms', text)
    found = {}
    # As rustfmt lays it out: on one line, or one field per line.
    spec = re.compile(r"TopicSpec \{\s*name: self\.(\w+)\.clone\(\),\s*cleanup: Cleanup::(\w+),\s*co_partitioned: (true|false),\s*"
                      r"retention_ms: (None|Some\((\d+) \* day\)),\s*min_compaction_lag_ms: (None|Some\(day\)),?\s*\}")
    for field, cleanup, co, _, days, lag in spec.findall(text):
        found[names[field]] = (cleanup.lower(), co == "true", int(days or 0), 1 if lag == "Some(day)" else 0)
    m = re.search(r"specs\.extend\(TIERS\.iter\(\)\.map\(\|t\| TopicSpec \{.*?cleanup: Cleanup::(\w+),\s*co_partitioned: (true|false),"
                  r"\s*retention_ms: Some\((\d+) \* day\)", text, re.S)
    if not m or not tiers:
        raise ValueError("crates/kafka/src/topics.rs: the retry tiers' TopicSpec not found (scan broken?)")
    for t in tiers:
        found[f"retry.{t}"] = (m.group(1).lower(), m.group(2) == "true", int(m.group(3)), 0)
    return found


def pod_files(pod, container):
    """{path: how it is provided} for each file a container gets from a Secret/ConfigMap volume; a directory whose
    volume projects every key maps to None."""
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    files = {}
    for m in container.get("volumeMounts", []):
        v = vols.get(m["name"])
        if v is None:
            continue
        base = m["mountPath"].rstrip("/")
        sources = []
        if "secret" in v:
            sources = [("secret", v["secret"].get("secretName"), v["secret"].get("items"))]
        elif "configMap" in v:
            sources = [("configMap", v["configMap"].get("name"), v["configMap"].get("items"))]
        elif "projected" in v:
            for src in v["projected"]["sources"]:
                for kind in ("secret", "configMap"):
                    if kind in src:
                        sources.append((kind, src[kind].get("name"), src[kind].get("items")))
        else:
            files[base + "/"] = ("dir", m["name"])
            continue
        for kind, name, items in sources:
            if items is None:
                files[base + "/*"] = (kind, name, None)
            for it in items or []:
                files[f"{base}/{it['path']}"] = (kind, name, it["key"])
    return files


def check_rendered(where, docs, values, schemas, strict_validate):
    """Schema validation of every rendered object, and the references between them."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = need("tomli", "tomli")
    have = {(d["kind"], d["metadata"]["name"]) for d in docs}
    n_crd = 0
    for d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        name = f"{where} {d.get('kind')} {d.get('metadata', {}).get('name')}"
        if key in schemas:
            n_crd += 1
            for e in sorted(jsonschema.Draft202012Validator(schemas[key]).iter_errors(d), key=lambda e: list(e.path)):
                fail(f"{name}: {'.'.join(map(str, e.path)) or '(root)'}: {e.message}")
        elif key[0] in {k[0] for k in chart_tools.CRDS}:
            fail(f"{name}: no schema for {key[1]} {key[0]} (CRD source missing)")
        else:
            try:
                strict_validate(d, K8S_VERSION, True)
            except Exception as e:  # noqa: BLE001 - kubernetes_validate raises its own exception kinds
                path = ".".join(map(str, getattr(e, "path", []) or []))
                fail(f"{name}: {path}: {getattr(e, 'message', e)}")
    # Secrets the values name exist outside the chart (Strimzi's, or created by the operator).
    k = values.get("kafka", {})
    external = {values.get("secrets", {}).get("existingSecret"), k.get("tls", {}).get("ca", {}).get("secretName"),
                k.get("tls", {}).get("clientCert", {}).get("secretName"),
                k.get("sasl", {}).get("passwordSecret", {}).get("name"),
                k.get("sasl", {}).get("jaasConfigSecret", {}).get("name")} - {None, ""}
    kafka_users = {d["metadata"]["name"] for d in docs if d["kind"] == "KafkaUser"}
    config = None
    for d in docs:
        if d["kind"] == "ConfigMap" and "hookline.toml" in d.get("data", {}):
            try:
                config = tomllib.loads(d["data"]["hookline.toml"])
            except Exception as e:  # noqa: BLE001
                fail(f"{where} ConfigMap {d['metadata']['name']}: hookline.toml does not parse: {e}")
    for d in docs:
        name = f"{where} {d['kind']} {d['metadata']['name']}"
        if d["kind"] in ("Deployment", "Job"):
            pod = d["spec"]["template"]["spec"]
            labels = d["spec"]["template"]["metadata"].get("labels", {})
            if d["kind"] == "Deployment" and not d["spec"]["selector"]["matchLabels"].items() <= labels.items():
                fail(f"{name}: selector does not match its pod labels")
            for v in pod.get("volumes", []):
                refs = []
                if "configMap" in v:
                    refs.append(("ConfigMap", v["configMap"]["name"], v["configMap"].get("optional")))
                if "secret" in v:
                    refs.append(("Secret", v["secret"]["secretName"], v["secret"].get("optional")))
                for src in (v.get("projected") or {}).get("sources", []):
                    if "secret" in src:
                        refs.append(("Secret", src["secret"]["name"], src["secret"].get("optional")))
                for kind, ref, optional in refs:
                    if (kind, ref) not in have and ref not in external and not optional:
                        fail(f"{name}: volume {v['name']} needs {kind} {ref}, which is neither rendered nor named in the values")
            for c in pod["containers"]:
                if (c.get("command") or [""])[0] not in BINARIES:
                    fail(f"{name}: command {c.get('command')} is not a hookline binary")
                for e in c.get("env", []):
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    if ref and ("Secret", ref["name"]) not in have and ref["name"] not in external and not ref.get("optional"):
                        fail(f"{name}: env {e['name']} needs Secret {ref['name']}")
                # Every file hookline.toml names is mounted in the container.
                files = pod_files(pod, c)
                kc = (config or {}).get("kafka", {})
                wanted = [(f"kafka.{t}.{key}", kc.get(t, {}).get(key)) for t, keys in
                          (("tls", ("ca_file", "cert_file", "key_file")), ("sasl", ("password_file", "jaas_config_file")),
                           ("oauth", ("client_secret_file",))) for key in keys]
                for key, path in wanted:
                    if not path:
                        continue
                    if path not in files and os.path.dirname(path) + "/*" not in files:
                        fail(f"{name}: {key} = {path}, but no volume of container {c['name']} provides that file")
                    elif (path in files and d["kind"] == "Job" and files[path][0] == "secret"
                          and "pre-install" in d["metadata"].get("annotations", {}).get("helm.sh/hook", "")
                          and (("Secret", files[path][1]) in have or files[path][1] in kafka_users)):
                        fail(f"{name}: a pre-install hook, but {key} = {path} comes from Secret {files[path][1]}, "
                             "which the release creates after its pre-install hooks")
                    elif path in files and files[path][0] == "secret" and files[path][1] == values.get("_chartSecret"):
                        secret = next((x for x in docs if x["kind"] == "Secret" and x["metadata"]["name"] == files[path][1]), None)
                        if secret is not None and files[path][2] not in (secret.get("stringData") or {}):
                            fail(f"{name}: {key} = {path} comes from key {files[path][2]} of the chart's Secret, which does not set it")
            # The root filesystem is read-only: ingest's SQLite delivery log needs a writable volume at its directory.
            log = (config or {}).get("log", {})
            if d["kind"] == "Deployment" and pod["containers"][0].get("command") == ["hookline-ingest"] and log.get("store") == "sqlite":
                mounts = {m["mountPath"]: m for m in pod["containers"][0].get("volumeMounts", [])}
                m = mounts.get(os.path.dirname(log.get("sqlite_path", "")))
                if m is None or m.get("readOnly"):
                    fail(f"{name}: log.sqlite_path {log.get('sqlite_path')} is on no writable volume (the root filesystem is read-only)")
        if d["kind"] == "Service":
            sel = d["spec"].get("selector", {})
            if not any(x["kind"] == "Deployment" and sel.items() <= x["spec"]["template"]["metadata"]["labels"].items() for x in docs):
                fail(f"{name}: selector matches no Deployment's pods")
        if d["kind"] == "PodDisruptionBudget":
            sel = d["spec"]["selector"]["matchLabels"]
            if not any(x["kind"] == "Deployment" and sel.items() <= x["spec"]["template"]["metadata"]["labels"].items() for x in docs):
                fail(f"{name}: selector matches no Deployment's pods")
        if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            target = d["spec"]["scaleTargetRef"]["name"]
            if ("Deployment", target) not in have:
                fail(f"{name}: scaleTargetRef {target} is not a rendered Deployment")
            hi = d["spec"].get("maxReplicas", d["spec"].get("maxReplicaCount"))
            if config and hi > config["kafka"]["partitions"]:
                fail(f"{name}: at most {hi} replicas, above kafka.partitions ({config['kafka']['partitions']}): the rest sit idle")
            dispatchers = [x for x in docs if x["kind"] == "Deployment" and x["metadata"]["name"] == target]
            if dispatchers and "replicas" in dispatchers[0]["spec"]:
                fail(f"{name}: the Deployment it scales also sets spec.replicas (every helm upgrade would reset the scale)")
        if d["kind"] == "ScaledObject" and config:
            for t in d["spec"]["triggers"]:
                md = t["metadata"]
                if t["type"] != "kafka" or md.get("topic") != config["kafka"]["topic_prefix"] + "deliveries":
                    fail(f"{name}: must scale on the kafka topic {config['kafka']['topic_prefix']}deliveries")
                if md.get("consumerGroup") != config["dispatcher"]["group_id"]:
                    fail(f"{name}: consumerGroup {md.get('consumerGroup')} is not dispatcher.group_id")
                if md.get("excludePersistentLag") not in (None, "false"):
                    fail(f"{name}: excludePersistentLag would hide a stuck dispatcher's lag")
        if d["kind"] == "ServiceMonitor":
            ports = {p["name"] for x in docs if x["kind"] == "Service" for p in x["spec"]["ports"]}
            for ep in d["spec"]["endpoints"]:
                if ep["port"] not in ports:
                    fail(f"{name}: endpoint port {ep['port']} is on no Service")
        if d["kind"] in ("KafkaTopic", "KafkaUser") and not d["metadata"].get("labels", {}).get("strimzi.io/cluster"):
            fail(f"{name}: no strimzi.io/cluster label")
        if d["kind"] == "KafkaUser":
            # The User Operator writes the user's Secret under the user's name: it must not be one the chart renders,
            # and the pods must use that Secret.
            user = d["metadata"]["name"]
            if ("Secret", user) in have:
                fail(f"{name}: the User Operator's Secret {user} would clash with the chart's Secret of that name")
            auth = d["spec"]["authentication"]["type"]
            sasl = k.get("sasl", {})
            from_jaas = sasl.get("jaasConfigSecret", {}).get("name") == user
            if auth.startswith("scram") and not from_jaas and (sasl.get("username") != user or sasl["passwordSecret"]["name"] != user):
                fail(f"{name}: kafka.sasl.username and kafka.sasl.passwordSecret.name (or kafka.sasl.jaasConfigSecret.name) "
                     f"are not the KafkaUser {user}")
            if auth == "tls" and k.get("tls", {}).get("clientCert", {}).get("secretName") != user:
                fail(f"{name}: kafka.tls.clientCert.secretName is not the KafkaUser's Secret {user}")
    topics = [d for d in docs if d["kind"] == "KafkaTopic"]
    if topics and config:
        prefix = config["kafka"]["topic_prefix"]
        want = {}
        for base, (cleanup, co, days, lag_days) in code_topics().items():
            want[prefix + base] = (config["kafka"]["partitions" if co else "event_partitions"], cleanup, days * 86_400_000 or None,
                                   lag_days * 86_400_000 or None)
        got = {t["spec"]["topicName"]: (t["spec"]["partitions"], t["spec"]["config"]["cleanup.policy"],
                                        t["spec"]["config"].get("retention.ms"), t["spec"]["config"].get("min.compaction.lag.ms"))
               for t in topics}
        for topic in sorted(set(want) | set(got)):
            if want.get(topic) != got.get(topic):
                fail(f"{where} KafkaTopic {topic}: (partitions, cleanup.policy, retention.ms, min.compaction.lag.ms) {got.get(topic)}, "
                     f"but `hookline topics create` makes {want.get(topic)}")
        if any(d["kind"] == "Job" for d in docs):
            fail(f"{where}: the topics Job is rendered beside KafkaTopics (the Topic Operator owns them)")
    return n_crd


def hookline_binary():
    """The `hookline` CLI when one is built (scripts/test builds the binaries before it runs check-deploy)."""
    for p in (os.environ.get("HOOKLINE_BIN"), os.path.join(ROOT, "target", "debug", "hookline"),
              os.path.join(ROOT, "target", "release", "hookline")):
        if p and os.access(p, os.X_OK):
            return p
    return None


# Stand-ins for secret values the rendered Secrets do not hold (they come from Secrets made outside the chart).
SECRET_STAND_INS = {"log-postgres-url": "postgres://check:check@127.0.0.1:5432/hookline"}


# What a Strimzi SCRAM KafkaUser's Secret has under sasl.jaas.config.
JAAS_STAND_IN = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="check" password="stand-in";\n'


def check_config_loads(where, docs, binary):
    """Each container's hookline.toml and HOOKLINE_* variables, loaded and validated by hookline's own config loader
    (`hookline topics list`, which contacts no cluster), with the files the pod mounts as stand-ins."""
    config_maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    secrets = {d["metadata"]["name"]: d.get("stringData") or {} for d in docs if d["kind"] == "Secret"}
    n = 0
    for d in docs:
        if d["kind"] not in ("Deployment", "Job"):
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"]:
            name = f"{where} {d['kind']} {d['metadata']['name']}"
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            for e in c.get("env", []):
                src = e.get("valueFrom") or {}
                if "value" in e:
                    env[e["name"]] = e["value"]
                elif "fieldRef" in src:
                    env[e["name"]] = "check-pod-0"
                elif "secretKeyRef" in src:
                    ref = src["secretKeyRef"]
                    value = secrets.get(ref["name"], {}).get(ref["key"], SECRET_STAND_INS.get(ref["key"]))
                    if value is not None:
                        env[e["name"]] = value
                    elif not ref.get("optional"):
                        fail(f"{name}: env {e['name']}: no stand-in for key {ref['key']} of Secret {ref['name']}")
            with tempfile.TemporaryDirectory() as tmp:
                text = None
                for path, how in pod_files(pod, c).items():
                    cm = config_maps.get(how[1]) if how[0] == "configMap" else None
                    if cm and (path.endswith("/hookline.toml") or (path.endswith("/*") and "hookline.toml" in cm.get("data", {}))):
                        text = cm["data"]["hookline.toml"]
                    elif not path.endswith(("/", "/*")):
                        os.makedirs(os.path.dirname(tmp + path), exist_ok=True)
                        open(tmp + path, "w").write(JAAS_STAND_IN if path.endswith(".jaas.config") else "stand-in\n")
                if text is None:
                    fail(f"{name}: container {c['name']} mounts no hookline.toml")
                    continue
                cfg = os.path.join(tmp, "hookline.toml")
                open(cfg, "w").write(text.replace('"/var/run/hookline/', f'"{tmp}/var/run/hookline/'))
                env["HOOKLINE_CONFIG"] = cfg
                r = subprocess.run([binary, "topics", "list", "--json"], capture_output=True, text=True, env=env, cwd=tmp)
                if r.returncode != 0:
                    fail(f"{name}: hookline does not accept the container's config: {(r.stderr or r.stdout).strip()}")
                n += 1
    return n


def check_helm_render():
    try:
        helm = chart_tools.helm()
    except chart_tools.ToolError as e:
        fail(f"helm {chart_tools.HELM_VERSION}: {e}")
        return
    schemas, missing = chart_tools.crd_schemas()
    for source, err in sorted(missing.items()):
        fail(f"CRD schemas of {source} could not be had: {err}")
    from kubernetes_validate.utils import validate as strict_validate

    binary = hookline_binary()
    if not binary:
        ok("rendered configs not loaded: no target/debug/hookline (HOOKLINE_BIN); scripts/test builds it first")
    base_values = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
    sets = sorted(glob.glob(os.path.join(CHART, "ci", "*.yaml")))
    if not sets:
        fail("helm/hookline/ci: no value sets to render")
    for vf in sets:
        where = f"helm template -f {rel(vf)}"
        lint = subprocess.run([helm, "lint", "--strict", CHART, "-f", vf], capture_output=True, text=True)
        if lint.returncode != 0:
            fail(f"helm lint --strict -f {rel(vf)}:\n{lint.stdout}{lint.stderr}")
        r = subprocess.run([helm, "template", RELEASE, CHART, "-f", vf, "--kube-version", K8S_VERSION, *helm_args(vf)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{where}: {r.stderr.strip()}")
            continue
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        values = merge(base_values, yaml.safe_load(open(vf)) or {})
        values["_chartSecret"] = values["secrets"].get("existingSecret") or RELEASE
        before = len(failures)
        n_crd = check_rendered(where, docs, values, schemas, strict_validate)
        loaded = check_config_loads(where, docs, binary) if binary else 0
        if len(failures) == before:
            kinds = sorted({d["kind"] for d in docs})
            loads = f", {loaded} containers' config accepted by hookline" if binary else ""
            ok(f"{where}: {len(docs)} objects valid ({n_crd} against CRD schemas){loads}: {', '.join(kinds)}")
    for vf in sorted(glob.glob(os.path.join(MUST_FAIL, "*.yaml"))):
        expect = next((m.group(1).strip() for line in open(vf) if (m := re.match(r"^#\s*expect:\s*(.+)$", line))), None)
        r = subprocess.run([helm, "template", RELEASE, CHART, "-f", vf, *helm_args(vf)], capture_output=True, text=True)
        if r.returncode == 0:
            fail(f"helm template -f {rel(vf)}: rendered, but the chart must refuse it")
        elif expect and expect not in r.stderr:
            fail(f"helm template -f {rel(vf)}: refused, but not with '{expect}': {r.stderr.strip()}")
        else:
            ok(f"helm template -f {rel(vf)}: refused as it must be")
    # The plain manifests are the chart's rendering; the alerts the chart ships are deploy/prometheus's.
    check_plain_manifests(helm)
    if open(os.path.join(CHART, "files", "alerts.yml")).read() != open(os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")).read():
        fail("helm/hookline/files/alerts.yml differs from deploy/prometheus/alerts.yml (copy it over)")


# The plain manifests are the chart's rendering (release hookline): deploy/kubernetes with the default values,
# deploy/kubernetes/optional with KEDA and the ServiceMonitor. `scripts/check-deploy --write-manifests` rewrites them
# (each file keeps its leading comments and its objects, in order).
PLAIN_MANIFESTS = [
    (os.path.join(ROOT, "deploy", "kubernetes", "*.yaml"), []),
    (os.path.join(ROOT, "deploy", "kubernetes", "optional", "*.yaml"),
     ["--set", "dispatcher.autoscaling.mode=keda", "--set", "serviceMonitor.enabled=true"]),
]
WRITE_MANIFESTS = "--write-manifests" in sys.argv


def rendered_documents(helm, args):
    """{(kind, name): (object, its text as helm printed it)}."""
    r = subprocess.run([helm, "template", RELEASE, CHART, "--kube-version", K8S_VERSION, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise chart_tools.ToolError(f"helm template {' '.join(args)}: {r.stderr.strip()}")
    out = {}
    for text in re.split(r"^---\s*$", r.stdout, flags=re.M):
        text = "\n".join(line for line in text.strip("\n").splitlines() if not line.startswith("# Source: ")).strip("\n") + "\n"
        d = yaml.safe_load(text)
        if d:
            out[(d["kind"], d["metadata"]["name"])] = (d, text)
    return out


def check_plain_manifests(helm):
    for pattern, args in PLAIN_MANIFESTS:
        try:
            rendered = rendered_documents(helm, args)
        except chart_tools.ToolError as e:
            fail(str(e))
            continue
        how = f"helm template {RELEASE} helm/hookline {' '.join(args)}".rstrip()
        for f in sorted(glob.glob(pattern)):
            text = open(f).read()
            header = "".join(re.match(r"^((?:#[^\n]*\n)*)", text).group(1))
            have = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}
            keys = list(have)
            missing = [k for k in keys if k not in rendered]
            if missing:
                fail(f"{rel(f)}: {missing} not in the chart's rendering ({how})")
                continue
            if WRITE_MANIFESTS:
                open(f, "w").write(header + "---\n".join(rendered[k][1] for k in keys))
                ok(f"{rel(f)}: rewritten from {how}")
                continue
            for k in keys:
                if rendered[k][0] != have[k]:
                    fail(f"{rel(f)} {k[0]} {k[1]}: differs from the chart's rendering ({how}); "
                         "scripts/check-deploy --write-manifests rewrites it")
        covered = {(d["kind"], d["metadata"]["name"]) for f in glob.glob(pattern) for d in yaml.safe_load_all(open(f)) if d}
        if not args:
            for k in sorted(set(rendered) - covered):
                fail(f"deploy/kubernetes: the chart's {k[0]} {k[1]} ({how}) is in no plain manifest")
    if not failures:
        ok("deploy/kubernetes and deploy/kubernetes/optional are the chart's rendering")


def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return out


def main():
    for check in (check_compose, check_dockerfile, check_kubernetes, check_helm, check_helm_render, check_alerts, check_dashboard,
                  check_catalogue):
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

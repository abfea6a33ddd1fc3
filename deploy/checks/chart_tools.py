"""Pinned tools and schemas for rendering and validating the Helm chart (used by check_deploy.py).

Everything comes from package registries and is cached under .cache/check-deploy/ (git-ignored), keyed by version,
so only the first run on a machine pays for it:

- helm: `go install helm.sh/helm/v4/cmd/helm@HELM_VERSION` (the Go module proxy) into the cache.
- KEDA's ScaledObject CRD: config/crd/bases of the Go module github.com/kedacore/keda/v2 (`go mod download`).
- The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs: example/prometheus-operator-crd of the Go module
  github.com/prometheus-operator/prometheus-operator (`go mod download`).
- Strimzi's KafkaTopic and KafkaUser CRDs: generated from the published API classes (Maven Central io.strimzi:api)
  by Strimzi's own generator (io.strimzi:crd-generator), the way Strimzi's build makes its install files; resolved
  with `mvn dependency:build-classpath`, run with a Java >= 21 (the generator's class files need it).

Each CRD's openAPIV3Schema is turned into a JSON schema (draft 2020-12) that, like the API server, refuses fields
the CRD does not declare (see openapi_to_jsonschema).
"""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CACHE = os.path.join(ROOT, ".cache", "check-deploy")

HELM_VERSION = "v4.3.2"
KEDA_MODULE, KEDA_VERSION = "github.com/kedacore/keda/v2", "v2.21.0"
PROM_OP_MODULE, PROM_OP_VERSION = "github.com/prometheus-operator/prometheus-operator", "v0.85.0"
STRIMZI_VERSION = "1.2.0"

# (apiVersion, kind) -> (source, version); crd_schemas() knows how to get each source's CRD documents.
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): ("keda", KEDA_VERSION),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("prometheus-operator", PROM_OP_VERSION),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("prometheus-operator", PROM_OP_VERSION),
    ("kafka.strimzi.io/v1", "KafkaTopic"): ("strimzi", STRIMZI_VERSION),
    ("kafka.strimzi.io/v1", "KafkaUser"): ("strimzi", STRIMZI_VERSION),
}


class ToolError(Exception):
    pass


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise ToolError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
    return r.stdout


# --- helm --------------------------------------------------------------------------------------------------------
def helm():
    """The pinned helm binary, built with `go install` on first use."""
    gobin = os.path.join(CACHE, f"helm-{HELM_VERSION}")
    binary = os.path.join(gobin, "helm")
    if os.access(binary, os.X_OK):
        return binary
    if not shutil.which("go"):
        raise ToolError("helm: needs the go command to build helm (go install helm.sh/helm/v4/cmd/helm)")
    os.makedirs(gobin, exist_ok=True)
    env = dict(os.environ, GOBIN=gobin, GOFLAGS="-buildvcs=false", CGO_ENABLED="0")
    run(["go", "install", f"helm.sh/helm/v4/cmd/helm@{HELM_VERSION}"], env=env)
    return binary


# --- CRD sources -------------------------------------------------------------------------------------------------
def go_module_dir(module, version):
    out = run(["go", "mod", "download", "-json", f"{module}@{version}"], env=dict(os.environ, GOFLAGS="-mod=mod"))
    info = json.loads(out)
    if info.get("Error") or not info.get("Dir"):
        raise ToolError(f"go mod download {module}@{version}: {info.get('Error')}")
    return info["Dir"]


def keda_crds():
    d = go_module_dir(KEDA_MODULE, KEDA_VERSION)
    return [os.path.join(d, "config", "crd", "bases", "keda.sh_scaledobjects.yaml")]


def prometheus_operator_crds():
    d = go_module_dir(PROM_OP_MODULE, PROM_OP_VERSION)
    base = os.path.join(d, "example", "prometheus-operator-crd")
    return [os.path.join(base, f"monitoring.coreos.com_{p}.yaml") for p in ("servicemonitors", "prometheusrules")]


def java_21():
    """A java of version 21 or later: $JAVA_HOME, PATH, /usr/lib/jvm/*; installed with apt-get when there is none."""
    def major(java):
        r = subprocess.run([java, "-version"], capture_output=True, text=True)
        m = re.search(r'version "(\d+)', r.stderr + r.stdout)
        return int(m.group(1)) if m else 0

    def candidates():
        if os.environ.get("JAVA_HOME"):
            yield os.path.join(os.environ["JAVA_HOME"], "bin", "java")
        if shutil.which("java"):
            yield shutil.which("java")
        yield from sorted(glob.glob("/usr/lib/jvm/*/bin/java"), reverse=True)

    for attempt in range(2):
        for j in candidates():
            if os.access(j, os.X_OK) and major(j) >= 21:
                return j
        if attempt == 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            for pkg in ("openjdk-25-jre-headless", "openjdk-21-jre-headless"):
                if subprocess.run(["apt-get", "install", "-y", "-qq", pkg], capture_output=True).returncode == 0:
                    break
    raise ToolError("strimzi: no Java >= 21 to run io.strimzi:crd-generator (and apt-get could not install one)")


STRIMZI_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.check-deploy</groupId><artifactId>strimzi-crds</artifactId><version>0</version>
  <dependencies>
    <dependency><groupId>io.strimzi</groupId><artifactId>api</artifactId><version>{v}</version></dependency>
    <dependency><groupId>io.strimzi</groupId><artifactId>crd-generator</artifactId><version>{v}</version></dependency>
  </dependencies>
</project>
"""


def strimzi_crds():
    mvn = shutil.which("mvn")
    if not mvn:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "maven"], capture_output=True)
        mvn = shutil.which("mvn")
        if not mvn:
            raise ToolError("strimzi: no mvn to resolve io.strimzi:api and io.strimzi:crd-generator")
    work = tempfile.mkdtemp(prefix="strimzi-crds-")
    try:
        open(os.path.join(work, "pom.xml"), "w").write(STRIMZI_POM.format(v=STRIMZI_VERSION))
        run([mvn, "-q", "-B", "dependency:build-classpath", "-Dmdep.outputFile=cp.txt"], cwd=work)
        cp = open(os.path.join(work, "cp.txt")).read().strip()
        out = [os.path.join(work, "kafkatopic.yaml"), os.path.join(work, "kafkauser.yaml")]
        run([java_21(), "-cp", cp, "io.strimzi.crdgenerator.CrdGenerator",
             "--crd-api-version", "v1", "--api-versions", "v1", "--storage-version", "v1", "--yaml",
             f"io.strimzi.api.kafka.model.topic.KafkaTopic={out[0]}",
             f"io.strimzi.api.kafka.model.user.KafkaUser={out[1]}"])
        return [open(p).read() for p in out]
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- openAPIV3Schema -> JSON schema ------------------------------------------------------------------------------
def openapi_to_jsonschema(s):
    """A CRD's structural openAPIV3Schema as a draft 2020-12 JSON schema.

    - x-kubernetes-int-or-string: integer or string; nullable: null is allowed too.
    - An object with `properties` and neither `additionalProperties` nor x-kubernetes-preserve-unknown-fields refuses
      other fields, as the API server's strict field validation does (it would otherwise prune them silently).
    - x-kubernetes-validations (CEL rules) are not evaluated.
    """
    if isinstance(s, list):
        return [openapi_to_jsonschema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k in ("properties", "patternProperties"):
            out[k] = {n: openapi_to_jsonschema(x) for n, x in v.items()}
        elif k in ("items", "additionalProperties", "not"):
            out[k] = openapi_to_jsonschema(v) if isinstance(v, (dict, list)) else v
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [openapi_to_jsonschema(x) for x in v]
        elif k.startswith("x-kubernetes-") or k in ("nullable", "description", "example", "externalDocs", "format"):
            continue
        else:
            out[k] = v
    if s.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        # The anyOf of int-or-string CRD fields often carries only `type`s; keep any extra constraints.
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if s.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if "properties" in out and "additionalProperties" not in out and not s.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _schemas_from(docs_text, source, version):
    import yaml

    found = {}
    for text in docs_text:
        for crd in yaml.safe_load_all(text):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for v in crd["spec"]["versions"]:
                schema = openapi_to_jsonschema(v["schema"]["openAPIV3Schema"])
                schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
                schema["$comment"] = f"from {source} {version}: CRD {crd['metadata']['name']} version {v['name']}"
                found[(f"{group}/{v['name']}", kind)] = schema
    return found


def crd_schemas():
    """{(apiVersion, kind): JSON schema} for every CRD in CRDS, and {source: error} for those that could not be had."""
    loaders = {
        "keda": lambda: [open(p).read() for p in keda_crds()],
        "prometheus-operator": lambda: [open(p).read() for p in prometheus_operator_crds()],
        "strimzi": strimzi_crds,
    }
    schemas, missing = {}, {}
    for source, version in sorted(set(CRDS.values())):
        d = os.path.join(CACHE, "schemas", f"{source}-{version}")
        wanted = [key for key, src in CRDS.items() if src == (source, version)]
        paths = {key: os.path.join(d, f"{key[1].lower()}-{key[0].replace('/', '_')}.json") for key in wanted}
        if not all(os.path.isfile(p) for p in paths.values()):
            try:
                got = _schemas_from(loaders[source](), source, version)
            except (ToolError, OSError) as e:
                missing[f"{source} {version}"] = str(e)
                continue
            os.makedirs(d, exist_ok=True)
            for key, p in paths.items():
                if key not in got:
                    missing[f"{source} {version}"] = f"no CRD for {key[1]} {key[0]} in what it publishes"
                    continue
                tmp = p + ".tmp"
                json.dump(got[key], open(tmp, "w"), indent=1, sort_keys=True)
                os.replace(tmp, p)
        for key, p in paths.items():
            if os.path.isfile(p):
                schemas[key] = json.load(open(p))
    return schemas, missing

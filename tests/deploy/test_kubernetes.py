"""The Kubernetes deployment (deploy/kubernetes/) renders with `kubectl kustomize` and its objects agree with each
other, with the Dockerfiles and with the engine: no cluster runs here, so the rendered YAML is checked, not run.

kubectl comes from the machine (`make test` installs Debian's kubernetes-client through devstack/kubectl.sh where
none is); without it the tests fail and say so. No schema validator runs: kubeconform and kubeval are neither on
PyPI nor in Debian."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from engine.lora.fingerprint import ModelFingerprint
from engine.models.prepare import cache_dir
from engine.server.cli import build_parser
from engine.server.metrics import EngineMetrics

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
TREES = ["base", "overlays/example"]
WORKLOADS = {"Deployment", "StatefulSet", "Job"}
SECRET_VARIABLES = {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                    "ENGINE_API_KEY", "EMAIL_HOST_PASSWORD", "METRICS_TOKEN"}


@cache
def rendered(tree: str) -> tuple[dict, ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH: run `bash devstack/kubectl.sh` (`make test` does)"
    result = subprocess.run([kubectl, "kustomize", str(KUBERNETES / tree)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(docs, kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs, kind: str, name: str) -> dict:
    matches = [doc for doc in of_kind(docs, kind) if doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered"
    return matches[0]


def pod_specs(docs) -> list[tuple[dict, dict]]:
    return [(doc, doc["spec"]["template"]["spec"]) for doc in docs if doc["kind"] in WORKLOADS]


def containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


def config_map(docs, reference: str) -> dict:
    """A ConfigMap by the name a pod uses (the generator's name with its hash suffix)."""
    return named(docs, "ConfigMap", reference)["data"]


def environment(docs, container: dict) -> dict[str, str]:
    """The container's literal environment: its ConfigMaps' keys, then its own values (secrets left out)."""
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(config_map(docs, source["configMapRef"]["name"]))
    env.update({var["name"]: var["value"] for var in container.get("env", []) if "value" in var})
    return env


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def dockerfile(name: str) -> str:
    return (ROOT / "docker" / name).read_text()


def dockerfile_array(text: str, instruction: str) -> list[str]:
    return json.loads(re.search(rf"^{instruction} (\[.*\])$", text, re.MULTILINE).group(1))


def dockerfile_user(text: str) -> int:
    return int(re.search(r"^USER (\d+)$", text, re.MULTILINE).group(1))


def compose_commands() -> dict[str, list[str]]:
    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    return {name: service["command"] for name, service in services.items() if "command" in service}


def engine_statefulset(docs) -> dict:
    return named(docs, "StatefulSet", "engine")


def engine_container(docs) -> dict:
    return engine_statefulset(docs)["spec"]["template"]["spec"]["containers"][0]


def web_image_containers(docs) -> list[dict]:
    engine_image = engine_container(docs)["image"]
    return [c for _, spec in pod_specs(docs) for c in containers(spec) if c["image"] != engine_image]


@pytest.mark.parametrize("tree", TREES)
def test_it_renders_every_part(tree):
    docs = rendered(tree)
    for kind, name in [("Deployment", "web"), ("Deployment", "worker"), ("Deployment", "beat"),
                       ("StatefulSet", "engine"), ("Job", "migrate"), ("Service", "web"), ("Service", "engine"),
                       ("HorizontalPodAutoscaler", "engine"), ("PodDisruptionBudget", "web"),
                       ("PodDisruptionBudget", "worker"), ("PodDisruptionBudget", "engine")]:
        named(docs, kind, name)
    assert named(docs, "Deployment", "beat")["spec"]["replicas"] == 1, "exactly one beat"


@pytest.mark.parametrize("tree", TREES)
def test_every_container_has_resources_and_runs_as_non_root(tree):
    for workload, spec in pod_specs(rendered(tree)):
        pod_security = spec.get("securityContext", {})
        for container in containers(spec):
            where = f"{workload['metadata']['name']}/{container['name']}"
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container.get("resources", {}).get(bound, {})), f"{where}: {bound}"
            security = {**pod_security, **container.get("securityContext", {})}
            assert security.get("runAsNonRoot") is True, where
            assert security.get("runAsUser", 0) > 0, where
            assert security.get("allowPrivilegeEscalation") is False, where
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where


@pytest.mark.parametrize("tree", TREES)
def test_long_running_containers_have_liveness_and_readiness_probes(tree):
    for workload, spec in pod_specs(rendered(tree)):
        if workload["kind"] == "Job":
            continue
        for container in spec["containers"]:
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in container, f"{workload['metadata']['name']}/{container['name']}: no {probe}"


def test_the_user_is_the_images_own():
    docs = rendered("overlays/example")
    web_user = dockerfile_user(dockerfile("Dockerfile.web"))
    engine_user = dockerfile_user(dockerfile("Dockerfile.engine"))
    for workload, spec in pod_specs(docs):
        for container in containers(spec):
            expected = engine_user if container["image"] == engine_container(docs)["image"] else web_user
            user = container.get("securityContext", {}).get("runAsUser", spec["securityContext"].get("runAsUser"))
            assert user == expected, f"{workload['metadata']['name']}/{container['name']}"


@pytest.mark.parametrize("tree", TREES)
def test_services_pdbs_and_the_hpa_point_at_workloads(tree):
    docs = rendered(tree)
    pods = [(workload, workload["spec"]["template"]) for workload in docs if workload["kind"] in WORKLOADS]
    for service in of_kind(docs, "Service"):
        chosen = [(w, t) for w, t in pods if selects(service["spec"]["selector"], t["metadata"]["labels"])]
        assert chosen, f"Service {service['metadata']['name']} selects no workload's pods"
        port_names = {p["name"] for _, t in chosen for c in t["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"Service {service['metadata']['name']}: {port['targetPort']}"
    for budget in of_kind(docs, "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        chosen = [w for w, t in pods if selects(selector, t["metadata"]["labels"])]
        assert len(chosen) == 1 and chosen[0]["kind"] != "Job", f"PDB {budget['metadata']['name']}: {chosen}"
    for autoscaler in of_kind(docs, "HorizontalPodAutoscaler"):
        target = autoscaler["spec"]["scaleTargetRef"]
        named(docs, target["kind"], target["name"])
    for workload in docs:
        if workload["kind"] in {"Deployment", "StatefulSet"}:
            assert selects(workload["spec"]["selector"]["matchLabels"],
                           workload["spec"]["template"]["metadata"]["labels"]), workload["metadata"]["name"]
    ingress = named(rendered("overlays/example"), "Ingress", "web")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["port"]["name"] in {p["name"] for p in named(docs, "Service", backend["name"])["spec"]["ports"]}


@pytest.mark.parametrize("tree", TREES)
def test_engine_urls_name_every_replica_the_engines_may_have(tree):
    """ENGINE_URLS lists engine-0 .. engine-(N-1) under the headless Service, N being the most replicas the
    StatefulSet can have (the HPA's maxReplicas; its spec.replicas is the HPA's minimum)."""
    docs = rendered(tree)
    statefulset = engine_statefulset(docs)
    service = named(docs, "Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "the StatefulSet's Service must be headless for per-pod names"
    autoscaler = named(docs, "HorizontalPodAutoscaler", "engine")
    assert autoscaler["spec"]["minReplicas"] == statefulset["spec"]["replicas"]
    replicas = autoscaler["spec"]["maxReplicas"]
    port = service["spec"]["ports"][0]["port"]
    expected = [f"http://{statefulset['metadata']['name']}-{i}.{service['metadata']['name']}:{port}"
                for i in range(replicas)]
    for workload in ("web", "worker"):
        container = named(docs, "Deployment", workload)["spec"]["template"]["spec"]["containers"][0]
        assert environment(docs, container)["ENGINE_URLS"].split(",") == expected, workload
    assert port == engine_container(docs)["ports"][0]["containerPort"]


@pytest.mark.parametrize("tree", TREES)
def test_secrets_come_only_by_reference(tree):
    docs = rendered(tree)
    assert not of_kind(docs, "Secret"), "a Secret object in the manifests holds literal secrets"
    for config in of_kind(docs, "ConfigMap"):
        assert not SECRET_VARIABLES & set(config.get("data", {})), config["metadata"]["name"]
    for workload, spec in pod_specs(docs):
        for container in containers(spec):
            where = f"{workload['metadata']['name']}/{container['name']}"
            for var in container.get("env", []):
                if var["name"] in SECRET_VARIABLES:
                    assert "secretKeyRef" in var.get("valueFrom", {}), f"{where}: {var['name']} is not a secret ref"
                assert "value" not in var or var["name"] not in SECRET_VARIABLES, where
            for source in container.get("envFrom", []):
                assert set(source) <= {"configMapRef", "secretRef"}, where
    for web in web_image_containers(docs):
        given = {var["name"] for var in web.get("env", [])}
        assert {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ENGINE_API_KEY"} <= given, web["name"]


def test_the_autoscaler_reads_the_metric_the_engine_exports():
    exported = EngineMetrics().requests_waiting.describe()[0].name
    autoscaler = named(rendered("base"), "HorizontalPodAutoscaler", "engine")
    [metric] = autoscaler["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == exported
    adapter = yaml.safe_load((KUBERNETES / "monitoring" / "prometheus-adapter-values.yaml").read_text())
    [rule] = adapter["rules"]["custom"]
    assert rule["seriesQuery"].startswith(exported + "{")
    assert re.fullmatch(rule["name"]["matches"], exported) and rule["name"]["as"] == exported
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}, "the HPA averages per pod"
    monitor = named(rendered("overlays/example"), "ServiceMonitor", "engine")
    [endpoint] = monitor["spec"]["endpoints"]
    engine_key = next(v for v in engine_container(rendered("base"))["env"] if v["name"] == "ENGINE_API_KEY")
    assert endpoint["path"] == "/metrics", "/metrics needs the engines' key, taken from their own Secret key:"
    assert endpoint["authorization"]["credentials"] == engine_key["valueFrom"]["secretKeyRef"]
    assert selects(monitor["spec"]["selector"]["matchLabels"], named(rendered("overlays/example"), "Service",
                                                                         "engine")["metadata"]["labels"])


def test_the_engine_runs_the_images_entrypoint_with_valid_arguments():
    docs = rendered("overlays/example")
    engine = engine_container(docs)
    text = dockerfile("Dockerfile.engine")
    assert "command" not in engine, "the image's ENTRYPOINT (python -m engine serve) must stay"
    assert dockerfile_array(text, "ENTRYPOINT") == ["python", "-m", "engine", "serve"]
    args = build_parser().parse_args(["serve", *engine["args"]])
    assert args.host == "0.0.0.0" and args.port == engine["ports"][0]["containerPort"]
    assert f"EXPOSE {args.port}" in text
    assert args.api_key_file is None and any(v["name"] == "ENGINE_API_KEY" for v in engine["env"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    model_cache = re.search(r"PLATFORM_MODEL_CACHE=(\S+)", text).group(1)
    statefulset = engine_statefulset(docs)
    claims = {claim["metadata"]["name"] for claim in statefulset["spec"]["volumeClaimTemplates"]}
    assert {"name": "models", "mountPath": model_cache} in engine["volumeMounts"] and "models" in claims
    prepare = statefulset["spec"]["template"]["spec"]["initContainers"][0]
    assert prepare["image"] == engine["image"] and args.model in prepare["command"][-1]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_the_web_image_runs_the_commands_compose_runs():
    docs = rendered("overlays/example")
    [image] = {c["image"] for c in web_image_containers(docs)}
    assert image.startswith("registry.example.com/lora-platform/web:")
    compose = compose_commands()
    web = named(docs, "Deployment", "web")["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in web and "args" not in web, "web runs Dockerfile.web's CMD (uvicorn, --lifespan on)"
    cmd = dockerfile_array(dockerfile("Dockerfile.web"), "CMD")
    assert cmd[:3] == ["python", "-m", "uvicorn"] and f"EXPOSE {web['ports'][0]['containerPort']}" in dockerfile(
        "Dockerfile.web")
    assert cmd[cmd.index("--port") + 1] == str(web["ports"][0]["containerPort"])
    for kind, name in [("Deployment", "worker"), ("Deployment", "beat"), ("Job", "migrate")]:
        container = named(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == compose[name], name
    # the probes' Host header is one Django accepts
    allowed = environment(docs, web)["ALLOWED_HOSTS"].split(",")
    [host] = [h["value"] for h in web["readinessProbe"]["httpGet"]["httpHeaders"] if h["name"] == "Host"]
    assert host in allowed
    assert web["livenessProbe"]["httpGet"]["path"].startswith("/static/vendor/")
    vendored = re.search(r"cp (node_modules/\S+ )+vendor/", dockerfile("Dockerfile.web")).group(0)
    assert Path(web["livenessProbe"]["httpGet"]["path"]).name in vendored, "the liveness file is in the image"
    spool = environment(docs, web)["GATEWAY_SPOOL_DIR"]
    assert spool in {m["mountPath"] for m in web["volumeMounts"]}


def test_the_worker_validates_against_the_served_models_config():
    docs = rendered("overlays/example")
    worker = named(docs, "Deployment", "worker")["spec"]["template"]["spec"]
    container = worker["containers"][0]
    path = Path(environment(docs, container)["BASE_MODEL_CONFIG"])
    [mount] = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    [volume] = [v for v in worker["volumes"] if v["name"] == mount["name"]]
    shipped = json.loads(config_map(docs, volume["configMap"]["name"])[path.name])
    served = environment(docs, container)["BASE_MODEL_NAME"]
    assert served in engine_container(docs)["args"][0]
    prepared = cache_dir() / served / "config.json"
    assert prepared.is_file(), f"{prepared} is missing: run `make model`"
    assert ModelFingerprint.from_hf_config(shipped) == ModelFingerprint.from_hf_config(json.loads(prepared.read_text()))


def test_the_example_sites_settings_pass_the_deploy_checks():
    """The web container's environment (ConfigMaps, and placeholders where secrets are referenced) through
    `manage.py check --deploy`, as tests/docker does for compose."""
    docs = rendered("overlays/example")
    web = named(docs, "Deployment", "web")["spec"]["template"]["spec"]["containers"][0]
    secrets = {var["name"]: "placeholder-" + "x" * 60 for var in web["env"] if "valueFrom" in var}
    secrets.update(DATABASE_URL="postgres://platform:x@127.0.0.1:5432/platform", REDIS_URL="redis://127.0.0.1:6379/0")
    env = {**{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}, **environment(docs, web),
           **secrets, "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.pop("GATEWAY_SPOOL_DIR")  # /app/ is the image's, not this checkout's
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, shlex.join(result.args) + "\n" + result.stdout + result.stderr

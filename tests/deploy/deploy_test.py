#!/usr/bin/python3
"""The deployment files of deploy/ (label deploy; docs/DEPLOY.md).

Kubernetes (deploy/kubernetes/**/*.yaml):
- schema: every resource validates against the Kubernetes OpenAPI schemas of KUBERNETES_VERSIONS
  in strict mode (an unknown field fails), offline (kubernetes-validate bundles the schemas);
- what a schema cannot see: every container flag is in its binary's --help; every $(VAR) in
  args is defined in the container's env; every secretKeyRef names a key of a Secret in the
  manifests, and a PDSERVE_* variable from a Secret is one the binary reads ("Env:" in --help);
  no secret on a command line; readiness on /ready, liveness and startup on /health; each
  workload's (Deployment, StatefulSet) selector matches its pods and each Service's selector
  and targetPort a pod's; the proxy runs at least two replicas, and the nodes' --proxy names
  every one of them (pdserve-proxy-N.<its headless, publishNotReadyAddresses Service>); every
  node runs --exit-when-drained and has a preStop hook that runs deploy/pdserve-drain on its
  own --port and --proxy; every HPA scales a Deployment of the manifests; the UCX ports (which
  carry no authentication) are reachable only from prefill and decode pods: a NetworkPolicy
  selects every node pod, admits each node container's UCX_TCP_PORT_RANGE only from node pods
  (never the proxy or anyone), still admits the nodes' HTTP port, and every node container
  names UCX_NET_DEVICES;
- live: the containers' command lines (model, pod IP, ports and proxy URLs replaced by local
  ones) form a cluster on the tiny model, with as many proxies as the manifest's replicas:
  each proxy's /ready turns 200 and lists both nodes, every probe path of every container
  answers 200, a chat completion goes through each proxy with the API key, and each node's
  preStop command drains it: it leaves every proxy's /cluster and exits 0.

systemd (deploy/systemd/*.service): `systemd-analyze verify` on copies whose binaries point at
the build (any warning fails); ExecStart flags in --help; ExecStop is pdserve-drain on the
node's own --port, with --exit-when-drained in ExecStart; every variable the units use is
defined by the example environment files, and the secrets file defines the variables the
binaries read. The node units refuse to start unless UCX_NET_DEVICES names an interface (their
ExecStartPre guard, run here with the variable unset, "all" and "eth1").

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR. Argument: a deploy/ folder to check instead
of the repository's (to see the test fail on a broken copy).
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml
import kubernetes_validate

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
DEPLOY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(t.SOURCE, "deploy")
ROLES = {"pdserve-proxy": "proxy", "pdserve-prefill": "prefill", "pdserve-decode": "decode"}
NODE_ROLES = ("pdserve-prefill", "pdserve-decode")
SECRET_FLAGS = ("--cluster-token", "--api-key")

_help = {}


def binary_help(binary):
    """(flags, env variables) of a binary's --help."""
    if binary not in _help:
        text = t.run([t.BINARIES[ROLES[binary]], "--help"])
        flags = set(re.findall(r"^\s+(?:-\w,)?(--[a-z0-9][a-z0-9-]*)", text, re.M))
        env = set(re.findall(r"\(Env:(\w+)\)", text))
        t.expect(len(flags) > 10, f"{binary} --help lists {len(flags)} flags")
        _help[binary] = (flags, env)
    return _help[binary]


def flags_of(argv):
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]


def option_value(argv, flag):
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# ---- Kubernetes ---------------------------------------------------------------------------

def load_manifests():
    resources = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "**", "*.yaml"), recursive=True)):
        with open(path, encoding="utf-8") as handle:
            for doc in yaml.safe_load_all(handle):
                if doc is not None:
                    resources.append((os.path.relpath(path, DEPLOY), doc))
    t.expect(resources, f"no manifests under {DEPLOY}/kubernetes")
    return resources


RESOURCES = load_manifests()


def of_kind(kind):
    return [doc for _, doc in RESOURCES if doc.get("kind") == kind]


WORKLOAD_KINDS = ("Deployment", "StatefulSet")


def workloads():
    return [doc for kind in WORKLOAD_KINDS for doc in of_kind(kind)]


def containers():
    """(workload, pod spec, container) of every Deployment and StatefulSet."""
    for workload in workloads():
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            yield workload, pod, container


def container_binary(container):
    command = container.get("command") or []
    t.expect(command and command[0] in ROLES, f"container {container['name']}: command {command} is not a pdserve binary")
    return command[0]


def container_env(container):
    return {item["name"]: item for item in container.get("env", [])}


def check_schemas():
    for version in KUBERNETES_VERSIONS:
        for path, doc in RESOURCES:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                where = "/".join(map(str, error.path))
                raise AssertionError(f"{path}: {doc.get('kind')}/{doc['metadata'].get('name')} against "
                                     f"Kubernetes {version} (strict): {where}: {error.message}") from None


def check_flags():
    for _, _, container in containers():
        binary = container_binary(container)
        flags, _ = binary_help(binary)
        argv = container.get("args", [])
        for flag in flags_of(argv):
            t.expect(flag in flags, f"container {container['name']}: {binary} has no flag {flag} (--help)")
        for flag in SECRET_FLAGS:
            t.expect(flag not in flags_of(argv), f"container {container['name']}: {flag} on the command line "
                     "(every process and pod reader sees it): pass it through the environment from a Secret")
        env = container_env(container)
        for arg in argv:
            for name in re.findall(r"\$\((\w+)\)", arg):
                t.expect(name in env, f"container {container['name']}: $({name}) in args is not in its env "
                         "(Kubernetes would pass it literally)")


def check_secrets():
    secrets = {}
    for secret in of_kind("Secret"):
        secrets[secret["metadata"]["name"]] = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for _, _, container in containers():
        binary = container_binary(container)
        _, binary_env = binary_help(binary)
        env = container_env(container)
        for name, item in env.items():
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref is None:
                continue
            t.expect(ref["name"] in secrets, f"container {container['name']}: env {name} reads Secret "
                     f"{ref['name']}, which no manifest defines")
            t.expect(ref["key"] in secrets[ref["name"]], f"container {container['name']}: env {name} reads key "
                     f"{ref['key']} of Secret {ref['name']}, which has {sorted(secrets[ref['name']])}")
            if name.startswith("PDSERVE_"):
                t.expect(name in binary_env, f"container {container['name']}: {binary} does not read ${name} "
                         f"(its --help reads {sorted(binary_env)})")
        t.expect("PDSERVE_CLUSTER_TOKEN" in env and "secretKeyRef" in env["PDSERVE_CLUSTER_TOKEN"].get("valueFrom", {}),
                 f"container {container['name']}: no PDSERVE_CLUSTER_TOKEN from a Secret (the binaries refuse to "
                 "start without a cluster token)")


def check_probes():
    for _, _, container in containers():
        ports = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
        for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/health"), ("startupProbe", "/health")):
            spec = container.get(probe)
            if spec is None:
                t.expect(probe == "startupProbe", f"container {container['name']}: no {probe}")
                continue
            get = spec.get("httpGet")
            t.expect(get is not None, f"container {container['name']}: {probe} is not an httpGet")
            t.expect_equal(get["path"], path, f"container {container['name']}: {probe} path")
            t.expect(get["port"] in ports, f"container {container['name']}: {probe} port {get['port']} is not a "
                     f"named container port ({sorted(ports)})")
        listen = option_value(container.get("args", []), "--port")
        t.expect(listen is not None and int(listen) in ports.values(),
                 f"container {container['name']}: --port {listen} is not a containerPort ({ports})")


def check_selectors():
    pod_labels = []
    for deployment, _, _ in containers():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        t.expect(selector.items() <= labels.items(), f"{deployment['kind']} {deployment['metadata']['name']}: selector "
                 f"{selector} does not match its pods {labels}")
        pod_labels.append((labels, deployment))
    for service in of_kind("Service"):
        selector = service["spec"]["selector"]
        matched = [d for labels, d in pod_labels if selector.items() <= labels.items()]
        t.expect(matched, f"Service {service['metadata']['name']}: selector {selector} matches no workload")
        for port in service["spec"]["ports"]:
            names = {p["name"] for d in matched for c in d["spec"]["template"]["spec"]["containers"]
                     for p in c.get("ports", [])}
            t.expect(port["targetPort"] in names, f"Service {service['metadata']['name']}: targetPort "
                     f"{port['targetPort']} is not a port of its pods ({names})")
    deployments = {d["metadata"]["name"] for d in of_kind("Deployment")}
    for hpa in of_kind("HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        t.expect(target["kind"] == "Deployment" and target["name"] in deployments,
                 f"HPA {hpa['metadata']['name']} scales {target}, not a Deployment of the manifests")


def selects(selector, labels):
    """Whether a LabelSelector (matchLabels, matchExpressions In/NotIn/Exists) selects `labels`."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def port_range(text):
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def check_network_policy():
    """UCX ports only between node pods; the nodes' HTTP ports as before."""
    pods = {d["metadata"]["name"]: (d["spec"]["template"]["metadata"]["labels"], c) for d, _, c in containers()}
    nodes = {name: value for name, value in pods.items() if container_binary(value[1]) in NODE_ROLES}
    others = {name: value for name, value in pods.items() if name not in nodes}
    policies = [p for p in of_kind("NetworkPolicy") if "Ingress" in p["spec"].get("policyTypes", [])]
    for name, (labels, container) in nodes.items():
        env = container_env(container)
        t.expect(env.get("UCX_NET_DEVICES", {}).get("value") not in (None, "", "all"),
                 f"{name}: UCX_NET_DEVICES must name the pod's interface")
        ucx_low, ucx_high = port_range(env.get("UCX_TCP_PORT_RANGE", {}).get("value", "0"))
        t.expect(ucx_low > 0, f"{name}: no UCX_TCP_PORT_RANGE: UCX listens on any port, no policy can name it")
        governing = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        t.expect(governing, f"{name}: no NetworkPolicy selects its pods (its UCX ports are open to all)")
        ucx_rules, http_allowed = [], False
        http = [p["name"] for p in container.get("ports", [])]
        for policy in governing:
            for rule in policy["spec"].get("ingress", []):
                ports = rule.get("ports", [])
                if any(p.get("port") in http for p in ports):
                    http_allowed = True
                covers = [p for p in ports if isinstance(p.get("port"), int)
                          and p["port"] <= ucx_high and p.get("endPort", p["port"]) >= ucx_low]
                t.expect(ports, f"{name}: NetworkPolicy {policy['metadata']['name']} admits every port")
                if covers:
                    ucx_rules.append((policy, rule, covers))
        t.expect(http_allowed, f"{name}: its HTTP port ({http}) is not admitted")
        t.expect(ucx_rules, f"{name}: no rule admits its UCX ports {ucx_low}-{ucx_high} (the KV could not land)")
        for policy, rule, covers in ucx_rules:
            sources = rule.get("from")
            t.expect(sources, f"{name}: {policy['metadata']['name']} admits UCX ports from anywhere")
            for source in sources:
                t.expect(set(source) == {"podSelector"}, f"{name}: UCX ports admitted from {source}, not only pods")
                for other, (other_labels, _) in others.items():
                    t.expect(not selects(source["podSelector"], other_labels),
                             f"{name}: UCX ports admitted from {other}'s pods")
            t.expect(any(p["port"] <= ucx_low and p.get("endPort", p["port"]) >= ucx_high for p in covers),
                     f"{name}: the UCX rule does not cover the whole range {ucx_low}-{ucx_high}")
        t.expect(all(any(selects(s["podSelector"], node_labels) for _, rule, _ in ucx_rules for s in rule["from"])
                     for node_labels, _ in nodes.values()), f"{name}: not every node pod may reach its UCX ports")


def node_containers():
    return [(d, p, c) for d, p, c in containers() if container_binary(c) in NODE_ROLES]


def prestop_argv(container):
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    t.expect(command and command[:2] == ["sh", "-c"] and len(command) == 3,
             f"container {container['name']}: preStop is not `sh -c COMMAND`: {command}")
    return shlex.split(command[2])


def proxy_workload():
    (proxy,) = [w for w, _, c in containers() if container_binary(c) == "pdserve-proxy"]
    return proxy


def check_proxy_urls(binary, proxy_url, services):
    """The node's --proxy value names every proxy replica by its stable name,
    <workload>-<N>.<headless Service>:<port>, through a Service published before readiness."""
    proxy = proxy_workload()
    replicas = proxy["spec"].get("replicas", 1)
    t.expect(proxy["kind"] == "StatefulSet" and replicas >= 2,
             f"the proxy is a {proxy['kind']} of {replicas} replicas: no single front door needs at least two, with "
             "names the nodes can register with one by one (a StatefulSet)")
    service_name = proxy["spec"]["serviceName"]
    service = services.get(service_name)
    t.expect(service is not None and service["spec"].get("clusterIP") == "None",
             f"the proxy StatefulSet's serviceName {service_name} is not a headless Service of the manifests")
    t.expect(service["spec"].get("publishNotReadyAddresses") is True,
             f"{binary}: registers through Service {service_name}, which follows the proxy's readiness (the proxy "
             "is ready only once a node registered): it needs publishNotReadyAddresses")
    named = []
    for url in proxy_url.split(","):
        match = re.fullmatch(r"http://([a-z0-9-]+)-(\d+)\.([a-z0-9-]+):(\d+)", url)
        t.expect(match and match.group(1) == proxy["metadata"]["name"] and match.group(3) == service_name,
                 f"{binary}: --proxy {url} is not <{proxy['metadata']['name']}-N>.<{service_name}>:PORT")
        t.expect(int(match.group(4)) in [p["port"] for p in service["spec"]["ports"]],
                 f"{binary}: --proxy {url}: no such port on Service {service_name}")
        named.append(int(match.group(2)))
    t.expect_equal(sorted(named), list(range(replicas)), f"{binary}: the proxy replicas --proxy names")


def check_nodes():
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    t.expect(len(workloads()) == 3, "one workload each for the proxy, prefill and decode pools")
    for deployment, pod, container in node_containers():
        binary = container_binary(container)
        argv = container["args"]
        env = container_env(container)
        t.expect("--exit-when-drained" in argv, f"{binary}: no --exit-when-drained (the drain waits for the exit)")
        t.expect_equal(option_value(argv, "--advertise-host"), "$(POD_IP)", f"{binary}: --advertise-host")
        t.expect_equal(env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"), "status.podIP",
                       f"{binary}: POD_IP from the downward API")
        proxy_arg = option_value(argv, "--proxy")
        proxy_url = env[re.fullmatch(r"\$\((\w+)\)", proxy_arg).group(1)]["value"] if proxy_arg.startswith("$(") else proxy_arg
        check_proxy_urls(binary, proxy_url, services)
        drain = prestop_argv(container)
        t.expect(drain[:2] == ["exec", "pdserve-drain"], f"{binary}: preStop runs {drain[:2]}, not pdserve-drain")
        t.expect_equal(option_value(drain, "--proxy"), "$" + re.fullmatch(r"\$\((\w+)\)", proxy_arg).group(1),
                       f"{binary}: preStop --proxy (the node's --proxy)")
        t.expect_equal(option_value(drain, "--node-url"), f"http://$POD_IP:{option_value(argv, '--port')}",
                       f"{binary}: preStop --node-url (the URL the node registers)")
        timeout = float(option_value(drain, "--timeout-s") or 600)
        t.expect(timeout < pod["terminationGracePeriodSeconds"], f"{binary}: the drain's {timeout} s do not fit in "
                 f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']}")


def check_live_cluster():
    """The manifests' command lines as a local cluster; each node drained by its preStop command."""
    model = t.make_model()
    token = t.CLUSTER_TOKEN
    api_key = "test-api-key"
    by_binary = {container_binary(c): c for _, _, c in containers()}
    processes = {}

    def local_argv(container, proxy_url):
        env = {name: item.get("value", "") for name, item in container_env(container).items()}
        env.update(POD_IP="127.0.0.1", PDSERVE_MODEL=model, PDSERVE_PROXY_URL=proxy_url or "")
        argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in container["args"]]
        for flag, value in (("--port", "0"), ("--host", "127.0.0.1"), ("--kv-cache-memory-gib", "0.25")):
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        if container_binary(container) in NODE_ROLES:
            argv += ["--threads", "1"]
        secrets = {"PDSERVE_CLUSTER_TOKEN": token, "PDSERVE_API_KEY": api_key}
        run_env = {name: secrets[name] if "secretKeyRef" in item.get("valueFrom", {}) else env[name]
                   for name, item in container_env(container).items()}
        return [t.BINARIES[ROLES[container_binary(container)]], *argv], run_env

    argv, env = local_argv(by_binary["pdserve-proxy"], None)
    proxies = [t.Process(f"proxy-{index}", argv, r"pdserve-proxy: listening on (http://\S+)", env=env)
               for index in range(proxy_workload()["spec"]["replicas"])]
    proxy_urls = [proxy.match.group(1) for proxy in proxies]
    proxy_url = ",".join(proxy_urls)  # the nodes' PDSERVE_PROXY_URL
    patterns = {"pdserve-prefill": r"pdserve-prefill: prefilling \S+ on (http://\S+)",
                "pdserve-decode": r"pdserve-decode: serving \S+ on (http://\S+)"}
    node_env = {}
    for binary in NODE_ROLES:
        argv, env = local_argv(by_binary[binary], proxy_url)
        processes[binary] = t.Process(ROLES[binary], argv, patterns[binary], timeout=180, env=env)
        node_env[binary] = env
    for url in proxy_urls:
        t.wait_until(lambda: t.http("GET", url + "/ready")[0] == 200, 60, f"the proxy {url}'s /ready answers 200")
        t.wait_until(lambda: sum(n["state"] == "up" for n in t.get_json(url + "/cluster", headers=t.cluster_headers())["nodes"]) == 2,
                     60, f"both nodes up in {url}/cluster")
    urls = {"pdserve-proxy": proxy_urls[0], **{b: p.match.group(1) for b, p in processes.items()}}
    for binary, container in by_binary.items():
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in container:
                path = container[probe]["httpGet"]["path"]
                status, body = t.http("GET", urls[binary] + path)
                t.expect_equal((status, path), (200, path), f"{binary}: GET {path} ({probe}): {body[:200]}")
    for url in proxy_urls:
        status, body = t.http("POST", url + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                              headers={"Authorization": f"Bearer {api_key}"})
        t.expect_equal(status, 200, f"a chat completion through the proxy {url} with the API key: {body[:300]}")
    status, _ = t.http("POST", proxy_urls[0] + "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    t.expect_equal(status, 401, "a chat completion without the API key")
    for binary in ("pdserve-prefill", "pdserve-decode"):
        node_url = urls[binary]
        port = node_url.rsplit(":", 1)[1]
        command = prestop_argv(by_binary[binary])[1:]  # without `exec`
        command = [arg.replace("$PDSERVE_PROXY_URL", proxy_url).replace("$POD_IP", "127.0.0.1")
                   for arg in command]
        at = command.index("--node-url") + 1
        command[at] = re.sub(r":\d+$", ":" + port, command[at])  # the node listens on port 0 here
        command[0] = os.path.join(DEPLOY, "pdserve-drain")
        result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120,
                                env=dict(os.environ, **node_env[binary]))
        t.expect(result.returncode == 0 and "drained and exited" in result.stderr,
                 f"{binary}: the preStop command {command} exited {result.returncode}: {result.stderr}")
        t.expect_equal(processes[binary].process.wait(30), 0, f"{binary}: exit code after its drain")
        for url in proxy_urls:
            nodes = t.get_json(url + "/cluster", headers=t.cluster_headers())["nodes"]
            t.expect(all(n["url"] != node_url for n in nodes), f"{binary}: still in {url}/cluster after its drain: {nodes}")
    for proxy in proxies:
        t.expect_equal(proxy.stop(), 0, f"{proxy.name}'s exit code on SIGTERM")


# ---- systemd ------------------------------------------------------------------------------

UNITS = sorted(glob.glob(os.path.join(DEPLOY, "systemd", "*.service")))


def unit_lines(path, key):
    with open(path, encoding="utf-8") as handle:
        return [line.split("=", 1)[1] for line in handle.read().splitlines() if line.startswith(key + "=")]


def env_file_vars(name):
    path = os.path.join(DEPLOY, "systemd", name)
    with open(path, encoding="utf-8") as handle:
        return {line.split("=", 1)[0].strip() for line in handle if re.match(r"^\w+=", line)}


def check_systemd_verify():
    t.expect(len(UNITS) == 3, f"three units (proxy, prefill, decode): {UNITS}")
    verify = shutil.which("systemd-analyze")
    t.expect(verify is not None, "systemd-analyze is missing (Debian package systemd, scripts/setup.sh)")
    copies = os.path.join(t.work_dir(), "units")
    os.makedirs(copies, exist_ok=True)
    for path in UNITS:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        for binary, role in ROLES.items():
            text = text.replace(f"/usr/local/bin/{binary} ", t.BINARIES[role] + " ")
        text = text.replace("/usr/local/bin/pdserve-drain ", os.path.join(DEPLOY, "pdserve-drain") + " ")
        with open(os.path.join(copies, os.path.basename(path)), "w", encoding="utf-8") as handle:
            handle.write(text)
    units = sorted(glob.glob(os.path.join(copies, "*.service")))
    result = subprocess.run([verify, "verify", *units], capture_output=True, text=True, timeout=60)
    output = (result.stdout + result.stderr).strip()
    t.expect(result.returncode == 0 and not output, f"systemd-analyze verify exited {result.returncode}:\n{output}")


def check_systemd_commands():
    defined = env_file_vars("pdserve.env.example") | env_file_vars("secrets.env.example") | {"MAINPID"}
    secrets = env_file_vars("secrets.env.example")
    for path in UNITS:
        name = os.path.basename(path)
        (exec_start,) = unit_lines(path, "ExecStart")
        argv = exec_start.split()
        binary = os.path.basename(argv[0])
        t.expect(binary in ROLES, f"{name}: ExecStart runs {argv[0]}")
        flags, binary_env = binary_help(binary)
        for flag in flags_of(argv[1:]):
            t.expect(flag in flags, f"{name}: {binary} has no flag {flag} (--help)")
            t.expect(flag not in SECRET_FLAGS, f"{name}: {flag} on the command line: use secrets.env")
        t.expect(unit_lines(path, "EnvironmentFile") == ["/etc/pdserve/pdserve.env", "/etc/pdserve/secrets.env"],
                 f"{name}: EnvironmentFile= is not the settings and the secrets file")
        for line in unit_lines(path, "ExecStart") + unit_lines(path, "ExecStop"):
            for var in re.findall(r"\$\{?(\w+)\}?", line):
                t.expect(var in defined, f"{name}: ${var} is set by neither example environment file")
        t.expect("PDSERVE_CLUSTER_TOKEN" in binary_env, f"{binary} does not read $PDSERVE_CLUSTER_TOKEN")
        for var in secrets:
            t.expect(var in binary_env or binary == "pdserve-prefill",
                     f"{name}: secrets.env sets {var}, which {binary} does not read")
        stops = unit_lines(path, "ExecStop")
        if binary in NODE_ROLES:
            t.expect("--exit-when-drained" in argv, f"{name}: no --exit-when-drained")
            t.expect(len(stops) == 1, f"{name}: one ExecStop= (the drain)")
            drain = stops[0].split()
            t.expect_equal(drain[0], "/usr/local/bin/pdserve-drain", f"{name}: ExecStop")
            t.expect_equal(option_value(drain, "--proxy"), option_value(argv, "--proxy"), f"{name}: drain --proxy")
            t.expect_equal(option_value(drain, "--node-url"),
                           f"http://{option_value(argv, '--advertise-host')}:{option_value(argv, '--port')}",
                           f"{name}: drain --node-url (the URL the node registers)")
            t.expect_equal(option_value(drain, "--wait-pid"), "${MAINPID}", f"{name}: drain --wait-pid")
            (stop_timeout,) = unit_lines(path, "TimeoutStopSec")
            t.expect(float(option_value(drain, "--timeout-s")) < float(stop_timeout),
                     f"{name}: the drain's timeout does not fit in TimeoutStopSec={stop_timeout}")
        for key in ("PrivateDevices", "ProtectProc", "MemoryDenyWriteExecute", "DynamicUser", "RemoveIPC"):
            if binary in NODE_ROLES:
                t.expect(not unit_lines(path, key), f"{name}: {key}= breaks UCX or the GPU (docs/DEPLOY.md)")


def check_systemd_ucx_interface():
    example = env_file_vars("pdserve.env.example")
    t.expect({"UCX_NET_DEVICES", "UCX_TCP_PORT_RANGE"} <= example,
             "pdserve.env.example sets UCX_NET_DEVICES and UCX_TCP_PORT_RANGE")
    for path in UNITS:
        name = os.path.basename(path)
        guards = unit_lines(path, "ExecStartPre")
        if os.path.basename(unit_lines(path, "ExecStart")[0].split()[0]) not in NODE_ROLES:
            continue
        t.expect(len(guards) == 1, f"{name}: one ExecStartPre= (the UCX interface guard)")
        # systemd turns $$ into $ and leaves the rest to the shell.
        argv = shlex.split(guards[0].replace("$$", "$"))
        for value, code in ((None, 2), ("all", 2), ("", 2), ("eth1", 0), ("mlx5_0:1", 0)):
            env = {k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"}
            if value is not None:
                env["UCX_NET_DEVICES"] = value
            result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=10)
            t.expect_equal(result.returncode, code, f"{name}: the guard with UCX_NET_DEVICES={value!r}")
            if code:
                t.expect("UCX_NET_DEVICES" in result.stderr, f"{name}: the guard names the variable: {result.stderr!r}")


def main():
    t.set_deadline(280)
    checks = [
        ("k8s schemas, strict, Kubernetes " + " and ".join(KUBERNETES_VERSIONS), check_schemas),
        ("k8s container flags in --help, $(VAR)s defined, no secret in args", check_flags),
        ("k8s secrets referenced exist and are read by the binary", check_secrets),
        ("k8s probes: /ready and /health on a container port", check_probes),
        ("k8s selectors, Service ports, HPA targets", check_selectors),
        ("k8s nodes: --advertise-host from the pod IP, --proxy every proxy replica, preStop drain", check_nodes),
        ("k8s NetworkPolicy: UCX ports only between node pods", check_network_policy),
        ("systemd-analyze verify", check_systemd_verify),
        ("systemd ExecStart flags, ExecStop drain, environment files", check_systemd_commands),
        ("systemd node units refuse UCX on every interface", check_systemd_ucx_interface),
    ]
    failed = t.run_checks(checks)
    if not failed:  # a cluster only when the files are consistent
        failed += t.run_checks([("the manifests' command lines as a cluster; preStop drains each node", check_live_cluster)])
    t.finish(failed)


if __name__ == "__main__":
    main()

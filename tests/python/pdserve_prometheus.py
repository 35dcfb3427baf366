"""A real Prometheus (Debian's `prometheus` package) for the metrics tests: it scrapes the
given targets every second with the project's scrape config (configs/prometheus/prometheus.yml,
its targets and intervals replaced), on a port the kernel just handed out (Prometheus cannot
listen on port 0), and is stopped when the test exits.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.parse

import yaml

import pdserve_testing as t

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_CONFIG = os.path.join(t.SOURCE, "configs/prometheus/prometheus.yml")
SCRAPE_INTERVAL_S = 1.0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def host_port(url):
    return urllib.parse.urlparse(url).netloc


def require_prometheus():
    if not os.access(PROMETHEUS, os.X_OK):
        sys.exit(f"{PROMETHEUS} is missing: Debian's prometheus package (scripts/setup.sh installs it)")


class Prometheus:
    def __init__(self, targets):
        require_prometheus()
        directory = os.path.join(t.work_dir(), "prometheus")
        os.makedirs(directory)
        with open(SCRAPE_CONFIG, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
        interval = f"{SCRAPE_INTERVAL_S:g}s"
        config["global"].update(scrape_interval=interval, evaluation_interval=interval)
        (job,) = config["scrape_configs"]
        self.job = job["job_name"]
        job.update(scrape_interval=interval, scrape_timeout=interval,
                   static_configs=[{"targets": [host_port(url) for url in targets]}])
        config_path = os.path.join(directory, "prometheus.yml")
        with open(config_path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle)
        self.url = f"http://127.0.0.1:{free_port()}"
        log = open(os.path.join(directory, "prometheus.log"), "w", encoding="utf-8")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={directory}/data",
             f"--web.listen-address={host_port(self.url)}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        t.add_cleanup(self.stop)
        t.wait_until(lambda: t.http("GET", self.url + "/-/ready", timeout=2)[0] == 200, 30,
                     "Prometheus ready")
        t.wait_until(lambda: self.scalar(f'count(up{{job="{self.job}"}} == 1)') == len(targets), 30,
                     f"Prometheus scraping all {len(targets)} targets")

    def wait_for_scrape_after(self, moment, what):
        """Until every target has been scraped after `moment` (unix seconds): its samples then
        hold what it exposed at or after that moment."""
        t.wait_until(lambda: self.scalar(f'min(timestamp(up{{job="{self.job}"}}))') > moment, 10 + 3 * SCRAPE_INTERVAL_S,
                     f"a scrape of every target after {what}")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def query(self, promql, at=None):
        """The instant vector of `promql` at `at` (unix seconds; now when None) as [(labels, value)]."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        status, body = t.http("GET", self.url + "/api/v1/query?" + urllib.parse.urlencode(params), timeout=10)
        t.expect_equal(status, 200, f"query {promql}: {body[:300]}")
        data = json.loads(body)["data"]
        t.expect_equal(data["resultType"], "vector", f"result type of {promql}")
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def scalar(self, promql, at=None):
        result = self.query(promql, at)
        t.expect_equal(len(result), 1, f"series of {promql} ({result})")
        return result[0][1]

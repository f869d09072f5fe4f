"""Shared helpers of the GPU benchmarks: start a local gpuctl fleet (one agent
owning every GPU of this host), submit jobs through the real path, and run the
reference tools in the same run so ratios compare like with like."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SP = os.environ.get("GPUCTL_SP", "/opt/torch/.venv/lib/python3.12/site-packages")
PY = os.environ.get("GPUCTL_PY", "/opt/torch/.venv/bin/python3")


def bin_dir():
    for cand in (os.environ.get("GPUCTL_BIN"), f"{ROOT}/.devbin", f"{ROOT}/target/release"):
        if cand and os.path.exists(f"{cand}/gpuctl"):
            return cand
    sys.exit("no gpuctl binaries: set GPUCTL_BIN or build with cargo build --release")


def gpu_env():
    env = dict(os.environ)
    libs = [f"{SP}/torch/lib", f"{SP}/nvidia/nccl/lib", f"{SP}/nvidia/cu13/lib"]
    env["LD_LIBRARY_PATH"] = ":".join(libs + [env.get("LD_LIBRARY_PATH", "")])
    # NVLink multicast stays off on shared hosts (see docs/benchmarks.md).
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def gpu_count():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([l for l in out.stdout.splitlines() if l.startswith("GPU ")])


def host_facts():
    q = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip().splitlines()
    name, driver = (q[0].split(", ") + ["?", "?"])[:2] if q else ("?", "?")
    return {"gpu": name, "gpus": len(q), "driver": driver, "date": time.strftime("%Y-%m-%d")}


class Fleet:
    """`gpuctl local up --agents 1` in the background, torn down on exit."""

    _next_port = 7171

    def __init__(self, port=None, agent_args=()):
        # A fresh port per fleet: a closing one may still hold the last.
        if port is None:
            port, Fleet._next_port = Fleet._next_port, Fleet._next_port + 1
        self.bin = bin_dir()
        self.dir = tempfile.mkdtemp(prefix="gpuctl-bench.")
        self.url = f"http://127.0.0.1:{port}"
        self.env = gpu_env()
        self.env["GPUCTL_COORDINATOR"] = self.url
        self.proc = subprocess.Popen(
            [f"{self.bin}/gpuctl", "local", "up", "--agents", "1", "--port", str(port),
             "--data-dir", self.dir, f"--agent-arg=--libtorch={SP}",
             *[f"--agent-arg={a}" for a in agent_args]],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(f"{self.dir}/local-up.log", "w"))
        for _ in range(240):
            out = subprocess.run([f"{self.bin}/gpuctl", "nodes", "--output", "json"],
                                 env=self.env, capture_output=True, text=True)
            if out.returncode == 0 and '"ready"' in out.stdout:
                return
            time.sleep(0.5)
        self.close()
        sys.exit("local fleet did not come up; see " + self.dir)

    def submit(self, *args):
        cmd = [f"{self.bin}/gpuctl", "submit", *args, "--nodes", "1", "--wait", "--output", "json"]
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError:
            print(out.stdout, out.stderr, file=sys.stderr)
            self.dump_logs()
            raise

    def dump_logs(self):
        for root, _, files in os.walk(self.dir):
            for f in files:
                if f.endswith(".log"):
                    p = os.path.join(root, f)
                    print(f"--- {p}", file=sys.stderr)
                    print(open(p, errors="replace").read()[-4000:], file=sys.stderr)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def ratio(a, b):
    return a / b if b else float("nan")


def job_reports(pattern):
    """Each job report a bench script saved under `pattern` (suites' own files and NVML samples
    left out), sorted: (name, report, why) with report None and why said where a job did not
    answer with a verdict, so that a summary says it rather than skipping it."""
    import glob

    for path in sorted(glob.glob(pattern)):
        name = os.path.basename(path)[:-5]
        if name.endswith(".suite") or name.startswith("nvml-links"):
            continue
        try:
            r = json.load(open(path))
        except Exception as e:
            yield name, None, f"no report ({e})"
            continue
        if "verdict" not in r:
            yield name, None, "no verdict in the answer"
            continue
        yield name, r, ""
